# SPDX-License-Identifier: Apache-2.0
"""vLLM's plugin entry point (pyproject.toml: vllm.general_plugins): registers the "reshard"
weight-transfer engine, worker and trainer side, in vLLM's own registries, lazily (the engine
module is imported when an engine is made). vLLM calls it in every process it starts; calling
it again does nothing. With NCCL_M2N_BACKEND=reshard in the environment it also makes
`import nccl.m2n` resolve to reshard.m2n in every vLLM process, so vLLM's own "m2n"
weight-transfer backend runs on reshard (docs/integrations.md)."""
import os

NAME = "reshard"


def register():
    if os.environ.get("NCCL_M2N_BACKEND") == "reshard":
        from reshard import m2n

        m2n.install()
    from vllm.distributed.weight_transfer.factory import (WeightTransferEngineFactory,
                                                          WeightTransferTrainerFactory)

    if NAME not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(NAME, "reshard.vllm_engine",
                                                    "ReshardWeightTransferEngine")
    if NAME not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(NAME, "reshard.vllm_engine",
                                                     "ReshardTrainerWeightTransferEngine")
