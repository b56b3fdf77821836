# SPDX-License-Identifier: Apache-2.0
"""vLLM's plugin entry point (pyproject.toml: vllm.general_plugins): registers the "reshard"
weight-transfer engine, worker and trainer side, in vLLM's own registries, lazily (the engine
module is imported when an engine is made). vLLM calls it in every process it starts; calling
it again does nothing."""

NAME = "reshard"


def register():
    from vllm.distributed.weight_transfer.factory import (WeightTransferEngineFactory,
                                                          WeightTransferTrainerFactory)

    if NAME not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(NAME, "reshard.vllm_engine",
                                                    "ReshardWeightTransferEngine")
    if NAME not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(NAME, "reshard.vllm_engine",
                                                     "ReshardTrainerWeightTransferEngine")
