# SPDX-License-Identifier: Apache-2.0
"""Shards only through veRL's own trainers: an actor worker that hands the "reshard" checkpoint
engine its training engine (whose get_per_tensor_param_shard yields local shards), and trainers
registered under veRL's trainer registry that use it.

Why a worker: verl 0.9.1's ActorRolloutRefWorker.update_weights
(verl/workers/engine_workers.py) passes `self.actor.engine` only when the backend's name is
"delta_sharded":

    if effective_mode == "delta_sharded":
        metrics = await self.checkpoint_engine.send_weights(self.actor.engine, ...)
        ...
    per_tensor_param, _ = self.actor.engine.get_per_tensor_param()

and every other backend gets get_per_tensor_param(), a generator of full tensors (each DTensor's
full_tensor(): an all-gather among the actor ranks). A backend cannot declare itself sharded in
any other way, so the engine alone cannot avoid that gather. veRL does choose its trainer by
name (trainer.v1.trainer_mode, verl.trainer.ppo.v1.register_trainer), and a trainer chooses its
actor worker class (_init_resource_pool_mgr, as veRL's own separate_async trainer does): the
trainers registered here are veRL's sync, colocate_async and separate_async ones with the actor
worker's update_weights handing the engine over for the "reshard" backend too. The user's
change is then

    actor_rollout_ref.rollout.checkpoint_engine.backend=reshard
    trainer.v1.trainer_mode=reshard_sync      (or reshard_colocate_async, reshard_separate_async)

Registered on `import verl` through this package's "verl.plugins" entry point
(reshard_trainers); importing veRL's trainers needs its training dependencies (datasets,
transfer_queue, peft, ...): where they are missing this module registers nothing and says why
in TRAINERS_SKIPPED.
"""
import logging

_log = logging.getLogger(__name__)

BACKEND = "reshard"
TRAINERS_SKIPPED = None  # why the trainers were not registered, or None


def _shards_only(base):
    """base's subclass whose update_weights passes the training engine to the reshard engine."""
    from verl.single_controller.base.decorator import Dispatch, register

    class ShardsOnly(base):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
        async def update_weights(self, global_steps: int = None, mode: str = "auto"):
            effective = mode if mode != "auto" else self.config.rollout.checkpoint_engine.backend
            if effective != BACKEND:
                return await base.update_weights(self, global_steps=global_steps, mode=mode)
            # the engine's get_per_tensor_param_shard: each rank's local shards, no gather
            metrics = await self.checkpoint_engine.send_weights(self.actor.engine,
                                                                global_steps=global_steps)
            return metrics or {}

    ShardsOnly.__name__ = ShardsOnly.__qualname__ = "Reshard" + base.__name__
    ShardsOnly.__module__ = __name__
    return ShardsOnly


def _with_worker(trainer, worker):
    """trainer's subclass whose actor (and fused ref) roles run worker."""
    import ray
    from verl.trainer.ppo.utils import Role

    class WithWorker(trainer):
        def _init_resource_pool_mgr(self):
            super()._init_resource_pool_mgr()
            for role in (Role.Actor, Role.ActorRollout, Role.ActorRolloutRef, Role.RefPolicy):
                if role in self.role_worker_mapping:
                    self.role_worker_mapping[role] = ray.remote(worker)

    WithWorker.__name__ = WithWorker.__qualname__ = "Reshard" + trainer.__name__
    WithWorker.__module__ = __name__
    return WithWorker


try:
    from verl.experimental.separation.engine_workers import DetachActorWorker
    from verl.trainer.ppo.v1 import get_trainer_cls, register_trainer
    from verl.workers.engine_workers import ActorRolloutRefWorker

    ReshardActorRolloutRefWorker = _shards_only(ActorRolloutRefWorker)
    ReshardDetachActorWorker = _shards_only(DetachActorWorker)
    for _mode, _worker in (("sync", ReshardActorRolloutRefWorker),
                           ("colocate_async", ReshardActorRolloutRefWorker),
                           ("separate_async", ReshardDetachActorWorker)):
        _cls = _with_worker(get_trainer_cls(_mode), _worker)
        globals()[_cls.__name__] = _cls  # found by name when Ray pickles it
        register_trainer("reshard_" + _mode)(_cls)
except Exception as _e:  # veRL without its training dependencies (a rollout-only install)
    TRAINERS_SKIPPED = "%s: %s" % (type(_e).__name__, _e)
    _log.debug("reshard.verl_workers: veRL's trainers not registered: %s", TRAINERS_SKIPPED)
