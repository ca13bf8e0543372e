"""Where the learners meet: the milestones every rank reaches in the same order (evaluations,
checkpoints, stop checks; runner/train/milestones.py), the quiescing of the algorithm around
them and the agreement on the exact global sample count. A part of the Trainer
(runner/trainer/loop.py), kept apart from the step loop."""

from __future__ import annotations

import logging
import time
from typing import Any

from ..checkpoint.preemption import STOPPED
from ..elastic.membership import lost_samples
from ..runlog.console import evaluation_postfix
from ..train.milestones import CHECKPOINT, EVALUATE, STOP_CHECK
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
        while (milestone := self.milestones.due(self.state.samples)) is not None:
            if milestone.kind != STOP_CHECK:  # the collective ones: every rank waits there
                self.algo.milestone_reached(milestone.samples)
            if milestone.kind == EVALUATE and milestone.final:
                self._meet()
                if self.state.samples < milestone.samples:  # an estimate ran ahead: train on
                    self.milestones.rearm()
                    self._leave()
                    return
                self._finish_algorithm()  # nothing may change the model after it is scored
                self.evaluate(final=True, met=True)
            else:
                if milestone.kind == EVALUATE:
                    self.evaluate()
                elif milestone.kind == CHECKPOINT:
                    self.save_checkpoint("scheduled")
                # Met anyway at an evaluation or a checkpoint: a stop is agreed there at once
                # (none after the final evaluation: the run has completed), else at the checks.
                reason = (self.stop.check(self.state.step) if milestone.kind == STOP_CHECK else
                          None if self.algo_finished else self.stop.now())
                if reason:
                    log.info("stop requested (%s): checkpointing at step %d", "Ctrl-C" if
                             reason == STOPPED else "SIGUSR1/SIGTERM", self.state.step)
                    self.stop_status = reason
                    return

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
        its checkpoint): gossip resumed between the two would be waited for again at once."""
        # The count may have been corrected downwards, and the pause was not training.
        self.throughput.restart(time.perf_counter(), self.state.samples)
        if not (self.algo_finished or self.milestones.collective_due(self.state.samples)):
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
            results = self.evaluator.score(self.algo.identical_replicas, final)
            consensus = self.evaluator.consensus_distance()
            per_rank = self.comm.gather_objects(rank_report(self))
        self._leave()
        epoch = state.samples / len(self.train_set)
        log.info("eval at epoch %.2f step %d: %s", epoch, state.step,
                 {s: {k: round(v, 4) for k, v in m.items()} for s, m in results.items()})
        if self.runlog:
            wall, spent = time.perf_counter() - self.start_time, self.timers.seconds
            where = {"epoch": round(epoch, 4), "step": state.step, "samples": state.samples,
                     "wall_s": round(wall, 3), "lr": self.lr,
                     "train_s": round(wall - spent["eval"] - spent["checkpoint"], 3)}
            state.history += self.runlog.record_evaluation(results, consensus, per_rank, where,
                                                           self.evaluator.examples)
        self.progress.update(state.samples, force=True, **evaluation_postfix(results))

    def save_checkpoint(self, reason: str) -> None:
        """Collective: quiesce the algorithm, refuse a poisoned state, write every rank's
        state (runner/checkpoint/checkpointer.py)."""
        self._meet()
        state = self.state
        refuse_poisoned_state(self.param_buffers, state.loss_is_finite(), self.comm,
                              self.world.rank, state.step, self.checkpointer.last)
        written_before = self.timers.seconds["checkpoint"]
        self.checkpointer.save(state.samples, state.step, state.samples / len(self.train_set),
                               reason, self._rank_state)
        if self.auto_checkpoints and reason == "scheduled":
            self._plan_next_checkpoint(self.timers.seconds["checkpoint"] - written_before)
        self._leave()

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
