"""Where the learners meet: the milestones every rank reaches in the same order (evaluations,
checkpoints, stop checks; runner/train/milestones.py), the quiescing of the algorithm around
them and the agreement on the exact global sample count. A part of the Trainer
(runner/trainer/loop.py), kept apart from the step loop."""

from __future__ import annotations

import logging
import time
from typing import Any

from ..checkpoint.background import CapturedCheckpoint, CheckpointWriter
from ..checkpoint.preemption import STOPPED
from ..comm import Communicator
from ..elastic.membership import lost_samples
from ..lazy import torch
from ..runlog.console import evaluation_postfix
from ..train.evaluation_beside import Evaluation, EvaluationsBeside
from ..train.milestones import CHECKPOINT, EVALUATE, STOP_CHECK, Milestone
from ..train.nonfinite import refuse_poisoned_state
from .rank_state import capture_rank_state
from .report import rank_report

log = logging.getLogger("adpsgd")


class Meetings:
    """The Trainer's methods for its milestones (it inherits them): they use its algorithm,
    communicator, counters, evaluator, checkpointer and records."""

    def _pass_milestones(self) -> None:
        """Act on every milestone the sample count has reached, in order (an evaluation makes
        an asynchronous count exact, which may reach further ones)."""
        if self.writer is not None:
            self.writer.poll()  # a checkpoint written beside training failed: say it now
        while (milestone := self._next_due()) is not None:
            if self._act_on(milestone):
                return

    def _next_due(self) -> Milestone | None:
        """The next milestone the count has reached, or the checkpoint listed at the point
        the ranks are met for (:meth:`_checkpoint_follows`)."""
        point = self._checkpoint_follows()
        return self.milestones.due(self.state.samples if point is None else point)

    def _checkpoint_follows(self) -> int | None:
        """The point the ranks are met at, when a checkpoint listed there comes next: an
        asynchronous count agreed at an evaluation may lie short of the point, and that
        checkpoint is then taken in the same meeting. The same answer on every rank, which
        read the same list at the same meeting. Not with checkpoints written beside training,
        which do not meet."""
        if not self.paused or self.writer is not None:
            return None
        last = self.milestones.last_passed()
        return last[0] if last and self.milestones.checkpoint_next_at(last[0]) else None

    def _act_on(self, milestone: Milestone) -> bool:
        """Evaluate, checkpoint or check for a stop at ``milestone``; whether the loop over
        the milestones ends here (a stop agreed, or a final evaluation the exact count has
        not reached)."""
        if milestone.kind != STOP_CHECK:  # the collective ones: every rank waits there
            self.algo.milestone_reached(milestone.samples)
        if milestone.kind == EVALUATE and milestone.final:
            with self.timers.time("eval"):
                self.collect_evaluations(leave=0)  # in order, before the final one
            self._meet()
            if self.state.samples < milestone.samples:  # an estimate ran ahead: train on
                self.milestones.rearm()
                self._leave()
                return True
            self._finish_algorithm()  # nothing may change the model after it is scored
            self.evaluate(final=True, met=True)
        else:
            met = milestone.kind != STOP_CHECK
            if milestone.kind == EVALUATE and self.beside is not None:
                met = self._evaluate_beside(milestone.samples)
            elif milestone.kind == EVALUATE:
                self.evaluate()
            elif milestone.kind == CHECKPOINT:
                met = self.save_checkpoint("scheduled")
            # Met anyway at an evaluation or a checkpoint: a stop is agreed there at once
            # (none after the final evaluation: the run has completed), else at the checks.
            reason = (self.stop.check(self.state.step) if milestone.kind == STOP_CHECK else
                      None if self.algo_finished or not met else self.stop.now())
            if reason:
                log.info("stop requested (%s): checkpointing at step %d", "Ctrl-C" if
                         reason == STOPPED else "SIGUSR1/SIGTERM", self.state.step)
                self.stop_status = reason
                return True
        return False

    def _meet(self) -> None:
        """Before a collective milestone (evaluation, checkpoint): quiesce the algorithm and
        agree on the exact global sample count. The time spent here is waiting for the
        slowest rank to reach the milestone (idle), also kept apart as milestone_wait."""
        with self.timers.time("idle"), self.timers.time("milestone_wait"):
            if not (self.algo_finished or self.paused):
                self.algo.pause()
                self.paused = True
            # The exact global count (asynchronous ranks only estimate it), lost learners' too.
            self.state.samples = int(self.comm.allreduce_numbers([self.state.local_samples])[0]
                                     + lost_samples(self.membership))
            self.algo.sync_global_samples(self.state.samples)
        self.milestone_waits += 1

    def _leave(self) -> None:
        """After a collective milestone: the algorithm goes on, unless it has finished or
        another collective milestone is due at this same count (an epoch's evaluation, then
        its checkpoint): gossip resumed between the two would be waited for again at once.
        An asynchronous count agreed at an evaluation may lie short of the checkpoint listed
        with it: that checkpoint is taken in this meeting too (:meth:`_checkpoint_follows`)."""
        # The count may have been corrected downwards, and the pause was not training.
        self.throughput.restart(time.perf_counter(), self.state.samples)
        if not (self.algo_finished or self.milestones.collective_due(self.state.samples)
                or self._checkpoint_follows() is not None):
            self.algo.resume()
            self.paused = False

    def _finish_algorithm(self) -> None:
        """End the algorithm's communication (collective, once): at the final evaluation, or
        after the loop when a stop came first."""
        if not self.algo_finished:
            self.algo.finish()
            self.algo_finished = True

    def evaluate(self, final: bool = False, met: bool = False) -> None:
        """Score the model(s) on the held-out set (collective); ``met``: the ranks have met
        at this milestone already (see :meth:`_meet`)."""
        if not met:
            self._meet()
        state = self.state
        if not final and self.milestones.another_due(EVALUATE, state.samples):
            # The exact count (the same on every rank now) passed the next evaluation too:
            # score the model once, there, rather than twice in a row.
            self._leave()
            return
        log.info("evaluating at step %d (%d samples)", state.step, state.samples)
        with self.timers.time("eval"), self.comm.traffic.aside():
            self.faults.slow_evaluation()
            scored = self.evaluator.score(self.algo.identical_replicas, final,
                                          attach=rank_report(self))
        self._leave()
        self._record_evaluation(scored.results, scored.consensus, scored.attached,
                                self._where(), self.evaluator.examples)

    def _where(self) -> dict[str, Any]:
        """Where the run is, as an evaluation's rows say: epoch, step, samples (as this rank
        knows the count), wall and training seconds (wall less evaluations and checkpoints),
        learning rate."""
        state, spent = self.state, self.timers.seconds
        wall = time.perf_counter() - self.start_time
        return {"epoch": round(state.samples / len(self.train_set), 4), "step": state.step,
                "samples": state.samples, "wall_s": round(wall, 3), "lr": self.lr,
                "train_s": round(wall - spent["eval"] - spent["checkpoint"], 3)}

    def _record_evaluation(self, results: dict[str, dict[str, float]], consensus: float,
                           per_rank: list | None, where: dict[str, Any],
                           examples: list[tuple[str, str, str]]) -> None:
        """Log an evaluation; rank 0 adds its rows to metrics.jsonl, TensorBoard and the
        history."""
        log.info("eval at epoch %.2f step %d: %s", where["epoch"], where["step"],
                 {s: {k: round(v, 4) for k, v in m.items()} for s, m in results.items()})
        if self.runlog:
            self.state.history += self.runlog.record_evaluation(results, consensus, per_rank,
                                                                where, examples)
        self.progress.update(self.state.samples, force=True, **evaluation_postfix(results))

    # ---- evaluations beside training (trainer.eval_in_background) ------------------------
    def set_up_beside(self) -> None:
        """trainer.eval_in_background=true: an evaluation thread with a communicator of its
        own (collective); trainer.checkpoint_in_background=true: a checkpoint-writing thread,
        likewise (both opt-in, and refused in elastic runs, whose learners change under the
        threads' communicators: runner/config/run_schema.py)."""
        def own(name: str) -> Communicator:  # a thread's duplicate of the learners'
            return Communicator(self.comm.mpi_comm.Dup(), "mpi", name=name,
                                timeout_s=self.comm.timeout_s)

        tcfg = self.cfg.trainer
        self.beside = (EvaluationsBeside(self.evaluator, own("evaluation"), len(self.train_set),
                                         self.algo.heard_counts,
                                         lambda: self.faults.slow_evaluation())
                       if tcfg.eval_in_background else None)
        self.writer = (CheckpointWriter(self.checkpointer, own("checkpoint"))
                       if tcfg.checkpoint_in_background else None)
        self.copied_at_meeting: tuple[int, int] | None = None  # (step, samples), when met
        self.evaluations_owed: list[dict[str, Any]] = []  # by the checkpoint being written
        self.owed_at_resume: list[dict[str, Any]] = []  # by the checkpoint resumed from

    def _evaluate_beside(self, samples: int) -> bool:
        """Copy the model here and score the copy in the evaluation thread
        (runner/train/evaluation_beside.py) while training goes on. Where a checkpoint follows
        at this same count, the learners meet for it first: the copy is then the checkpointed
        state, which a run resumed from that checkpoint scores again if the thread had not
        finished (``evaluations_owed``). Every choice here follows what all learners share
        (the milestone list; at a meeting, the exact count), never a learner's estimate: each
        copies at the same evaluations, or the threads' collectives would pair different
        copies. Returns whether the learners are together here (met)."""
        state = self.state
        if self.paused and self.copied_at_meeting == (state.step, state.samples):
            self._leave()  # met and copied here already (an exact count past two evaluations)
            return True
        if self.milestones.checkpoint_next_at(samples) and self.writer is None:
            self._meet()  # the checkpoint meets there anyway
        met = self.paused
        log.info("evaluating beside training at step %d (%d samples)", state.step,
                 state.samples)
        where = {**self._where(), "stamp": time.time()}  # the thread sets the exact count
        self.beside.submit(Evaluation(
            self.evaluator.copy_model(self.algo.copy_parameters()),
            self.algo.identical_replicas, where, rank_report(self), state.local_samples))
        self.copied_at_meeting = (state.step, state.samples) if met else None
        if met:
            self._leave()
        self.collect_evaluations()
        return met

    def close_beside(self) -> None:
        """At the end: record every evaluation, wait for the last write, end the threads."""
        self.collect_evaluations(leave=0)
        if self.beside is not None:
            self.beside.close()
        if self.writer is not None:
            self.writer.close()

    def collect_evaluations(self, leave: int | None = None) -> None:
        """Record the evaluations the thread has scored (``leave``: wait until no more than
        that many are pending)."""
        if self.beside is None:
            return
        for evaluation in self.beside.collect(leave):
            self.timers.add("eval_beside", evaluation.seconds)
            if self.state.history and \
                    self.state.history[-1]["samples"] == evaluation.where["samples"]:
                continue  # copies at the same count (the same steps): one row is enough
            self._record_evaluation(evaluation.results, evaluation.consensus,
                                    evaluation.per_rank, evaluation.where,
                                    evaluation.examples)

    def _evaluations_owed(self) -> list[dict[str, Any]]:
        """At a checkpoint (met): wait for the evaluations copied before this meeting, so that
        the checkpoint's history has them; one copied at this meeting is the state being
        checkpointed, and is owed by it instead (where it was), whether or not scored yet."""
        if self.beside is None:
            return []
        here = self.copied_at_meeting == (self.state.step, self.state.samples)
        with self.timers.time("eval"):
            self.collect_evaluations(leave=1 if here else 0)
        return [self.beside.uncollected[-1].where] if here else []

    def evaluate_owed(self, owed: list[dict[str, Any]]) -> None:
        """A resumed run's first act: score the restored models for the evaluations its
        checkpoint owed (copied before it was written and not recorded by then), once, at
        the checkpoint's count (a copy taken at a meeting is the checkpointed state; one taken
        beside training came at most a few steps before it)."""
        for where in owed[-1:]:
            where = {**where, "samples": self.state.samples,
                     "epoch": round(self.state.samples / len(self.train_set), 4)}
            log.info("evaluating at step %d (%d samples), owed by the checkpoint resumed from",
                     where["step"], where["samples"])
            with self.timers.time("eval"), self.comm.traffic.aside():
                scored = self.evaluator.score(self.algo.identical_replicas, False,
                                              attach=rank_report(self))
            self._record_evaluation(scored.results, scored.consensus, scored.attached, where,
                                    self.evaluator.examples)

    def save_checkpoint(self, reason: str) -> bool:
        """Collective: quiesce the algorithm, refuse a poisoned state, write every rank's
        state (runner/checkpoint/checkpointer.py); a scheduled one, with a writer, beside
        training (:meth:`_checkpoint_beside`). A checkpoint waits for the previous write.
        Returns whether the learners met for it."""
        if self.writer is not None:
            with self.timers.time("checkpoint"):
                self.writer.wait()
            if reason == "scheduled" and not self.algo_finished:
                self._checkpoint_beside()
                return False
        self._meet()
        state = self.state
        self.evaluations_owed = self._evaluations_owed()
        refuse_poisoned_state(self.param_buffers, state.loss_is_finite(), self.comm,
                              self.world.rank, state.step, self.checkpointer.last)
        written_before = self.timers.seconds["checkpoint"]
        self.checkpointer.save(state.samples, state.step, state.samples / len(self.train_set),
                               reason, self._rank_state)
        self.evaluations_owed = []
        if self.auto_checkpoints and reason == "scheduled":
            self._plan_next_checkpoint(self.timers.seconds["checkpoint"] - written_before)
        self._leave()
        return True

    def _checkpoint_beside(self) -> None:
        """Take this rank's part of the checkpoint now, without meeting, and hand it to the
        writing thread (runner/checkpoint/background.py): training goes on."""
        state = self.state
        with self.timers.time("checkpoint"):
            capture = self.algo.capture_state()
            finite = state.loss_is_finite() and all(
                bool(torch.isfinite(flat).all()) for flat in self.param_buffers)
            # Evaluations still being scored are not waited for: a run resumed from this
            # checkpoint scores its models for them (evaluate_owed).
            self.evaluations_owed = [e.where for e in (self.beside.uncollected
                                                       if self.beside is not None else [])]
            self.writer.submit(CapturedCheckpoint(
                capture_rank_state(self, capture), capture, self.algo, state.step,
                "scheduled", len(self.train_set), finite))
            self.evaluations_owed = []
        log.info("checkpoint beside training at step %d", state.step)

    def _plan_next_checkpoint(self, cost_s: float) -> None:
        """trainer.checkpoint_every=auto: the next checkpoint, Young's period after this one
        (runner/checkpoint/period.py). Every rank plans from the same numbers: the slowest
        rank's write and training seconds. A checkpoint that was there already (not written
        again) measures nothing: the last cost measured stands."""
        spent = self.timers.seconds
        train_s = time.perf_counter() - self.start_time - spent["eval"] - spent["checkpoint"]
        cost_s, train_s = self.comm.allreduce_numbers([cost_s, train_s], op="max")
        if cost_s <= 0 and self.checkpoint_periods:
            cost_s = self.checkpoint_periods[-1]["checkpoint_s"]
        if cost_s <= 0 or train_s <= 0:  # nothing measured yet: measure at the next one
            point, record = self.auto_checkpoints.first(self.state.samples), None
        else:
            point, record = self.auto_checkpoints.next(self.state.samples, cost_s,
                                                       self.state.samples / train_s)
            self.checkpoint_periods.append(record)
            log.info("checkpoint_every=auto: %.3f s to write, job MTBF %g s: Young's period "
                     "%.1f s of training, %d samples at %.1f samples/s; next checkpoint at %s",
                     cost_s, record["mtbf_s"], record["period_s"], record["period_samples"],
                     record["samples_per_s"], point if point is not None else "the end")
        if point is not None:
            self.milestones.add_checkpoint(point)

    def _rank_state(self) -> dict[str, Any]:
        return capture_rank_state(self)
