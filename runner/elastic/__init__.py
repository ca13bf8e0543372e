"""Elastic training (``launcher.elastic=true``): learners are lost and the others go on.

* membership.py: who the learners are (:class:`Membership`, owned by the Trainer), each step
  as a transaction that a loss undoes, the shrink to the survivors, and the ledger that keeps
  every sample of an epoch used once;
* streams.py: asynchronous learners' own passes, and a lost learner's rest dealt to others;
* new_world.py: the survivors' (or grown set's) communicators and the unread rest of a pass;
* spares.py: learners started with the job that wait, then join at a loss;
* launcher_link.py: a rank told by the launcher that learners behind a cut link are lost.

The Trainer enters it through ``Membership.of`` and :func:`elastic_step`, and hands itself to
it for :meth:`runner.trainer.Trainer.regroup`; what it asks of an algorithm is declared on
runner/algos/base.py's ``Algorithm`` (``check_peers``, ``continue_after_loss``,
``heard_samples``, ``start_joiners_at_the_mean``). MPI's side (revoke, agree, shrink) is
runner/comm/ulfm.py; the launcher's (heartbeats, losses declared) runner/launch/.
"""
