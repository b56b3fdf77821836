# SPDX-License-Identifier: Apache-2.0
"""reshard.models on stand-in modules (vLLM's layer classes by name, with vLLM's attributes):
GQA views, expert parallelism, vocabulary padding, names between the sides. The real layers
are exercised by vllm_check.py and megatron_check.py (make test-frameworks)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import reshard  # noqa: E402
from reshard import models  # noqa: E402

try:
    import torch
except ImportError:
    torch = None


class Names(unittest.TestCase):
    def lay(self):
        return reshard.Layout("shape=4 dtype=f32 ranks=0 place=R")

    def test_a_tensor_on_one_side_only_is_named(self):
        with self.assertRaises(reshard.ReshardError) as e:
            models.pair({"a": self.lay(), "b": self.lay()}, {"a": self.lay(), "c": self.lay()})
        self.assertIn("only the source has b; only the destination has c", e.exception.message)
        got = models.pair({"a": self.lay(), "b": self.lay()}, {"a": self.lay()}, ignore=["^b$"])
        self.assertEqual([n for n, _, _ in got], ["a"])

    def test_rename_maps_megatron_names_and_refuses_collisions(self):
        got = models.rename({"decoder.layers.3.mlp.linear_fc2.weight": self.lay()},
                            models.MEGATRON_TO_HF)
        self.assertEqual(list(got), ["model.layers.3.mlp.down_proj.weight"])
        with self.assertRaises(reshard.ReshardError) as e:
            models.rename({"x.a": self.lay(), "y.a": self.lay()}, [(r"^\w\.", "")])
        self.assertIn("both become a", e.exception.message)


@unittest.skipIf(torch is None, "torch is not installed: make test-frameworks runs these")
class VllmStandIns(unittest.TestCase):
    def layer(self, kind, **attrs):
        m = type(kind, (torch.nn.Module,), {})()
        for k, v in attrs.items():
            if isinstance(v, torch.Tensor):
                m.register_parameter(k, torch.nn.Parameter(v, requires_grad=False))
            else:
                setattr(m, k, v)
        return m

    def test_gqa_kv_heads_are_replicated_when_tp_exceeds_them(self):
        net = torch.nn.Module()
        net.attn = torch.nn.Module()
        # tp 4, 8 heads and 2 kv heads of 2: rank r holds 2 q heads, kv head r // 2
        net.attn.qkv_proj = self.layer("QKVParallelLinear", tp_size=4, head_size=2,
                                       total_num_heads=8, total_num_kv_heads=2,
                                       weight=torch.zeros((2 + 1 + 1) * 2, 3))
        lays = models.vllm_layouts(net, range(4))
        self.assertEqual(sorted(lays), ["attn.k_proj.weight", "attn.q_proj.weight",
                                        "attn.v_proj.weight"])
        k = lays["attn.k_proj.weight"]
        self.assertEqual([k.shard_index(r, 0) for r in range(4)], [[0, 1], [0, 1], [2, 3], [2, 3]])
        self.assertEqual(k.view["offset"], 4 * 3, "k starts after the rank's 2 q heads")
        self.assertIs(lays.buffers["attn.v_proj.weight"], net.attn.qkv_proj.weight)

    def test_fused_moe_experts_over_the_ep_ranks(self):
        net = torch.nn.Module()
        net.experts = self.layer("FusedMoE", ep_size=2, tp_size=1,
                                 w13_weight=torch.zeros(2, 8, 4), w2_weight=torch.zeros(2, 4, 4))
        lays = models.vllm_layouts(net, [4, 5])
        w13 = lays["experts.w13_weight"]
        self.assertEqual(w13.shape, (4, 8, 4))
        self.assertEqual([w13.shard_index(r, 0) for r in (4, 5)], [[0, 1], [2, 3]])

    def test_vocabulary_padding(self):
        net = torch.nn.Module()
        # 128 rows over tp 2, 64 per rank: torch.chunk's rows, at the start of each buffer
        net.embed = self.layer("VocabParallelEmbedding", tp_size=2, org_vocab_size=128,
                               weight=torch.zeros(64, 3))
        lay = models.vllm_layouts(net, range(2))["embed.weight"]
        self.assertEqual((lay.shape, lay.shard_shape(1), lay.view["buffer"]),
                         ((128, 3), (64, 3), "embed.weight"))
        # 100 rows padded to 64 per rank: rows 0-63 and 64-99, not torch.chunk's 50 and 50,
        # so the tensor is the padded one (128 rows) on both sides
        net.embed = self.layer("VocabParallelEmbedding", tp_size=2, org_vocab_size=100,
                               weight=torch.zeros(64, 3))
        lay = models.vllm_layouts(net, range(2))["embed.weight"]
        self.assertEqual((lay.shape, lay.shard_index(1, 0)[0]), ((128, 3), 64))


class MegatronRanks(unittest.TestCase):
    def test_groups_follow_the_order_fastest_first(self):
        par = models.MegatronParallel(tp=2, dp=2, pp=2)
        self.assertEqual(par.groups("tp"), [[0, 1], [2, 3], [4, 5], [6, 7]])
        self.assertEqual(par.groups("pp"), [[0, 4], [1, 5], [2, 6], [3, 7]])
        self.assertEqual(models.MegatronParallel(tp=2, dp=2, pp=2, order="tp-cp-ep-pp-dp")
                         .groups("pp"), [[0, 2], [1, 3], [4, 6], [5, 7]])

    def test_an_order_megatron_refuses_is_refused(self):
        with self.assertRaises(reshard.ReshardError) as e:
            models.MegatronParallel(tp=4, dp=2, pp=2, ep=2, order="tp-cp-ep-pp-dp")
        self.assertIn("must equal dp 2", e.exception.message)


if __name__ == "__main__":
    unittest.main()
