# SPDX-License-Identifier: Apache-2.0
"""scripts/gen-manifest.py as a user meets it: its errors are one line and never a traceback
(an unwritable -o, a reader that closes the pipe early, ^C), its help says what it does, and
it refuses the rank orders megatron-core refuses. crosscheck.py compares it with transformers
and megatron-core themselves (make test-frameworks)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "gen-manifest.py")
LLAMA = ["--model", "llama-3.1-70b", "--train", "tp=8", "--infer", "tp=8"]


def run(args, **kw):
    return subprocess.run([sys.executable, SCRIPT] + args, capture_output=True, text=True,
                          timeout=120, **kw)


class GenManifest(unittest.TestCase):
    def test_an_unwritable_output_is_one_line(self):
        with tempfile.TemporaryDirectory() as tmp:
            r = run(LLAMA + ["-o", os.path.join(tmp, "missing", "m.json")])
        self.assertEqual(r.returncode, 2)
        self.assertNotIn("Traceback", r.stderr)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
        self.assertIn("gen-manifest: cannot write", r.stderr)
        self.assertIn("No such file or directory", r.stderr)

    def test_a_reader_that_leaves_early_gets_no_traceback(self):
        # DeepSeek-V3's manifest is megabytes: the reader closes after the first bytes
        p = subprocess.Popen([sys.executable, SCRIPT, "--model", "deepseek-v3", "--train",
                              "tp=1,pp=16,ep=16,dp=16", "--infer", "tp=32,dp=8"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = p.stdout.read(64)
        p.stdout.close()
        err = p.stderr.read().decode()
        rc = p.wait(timeout=120)
        self.assertTrue(first.startswith(b'{"version":1'), first)
        self.assertNotIn("Traceback", err)
        self.assertEqual(err, "")
        self.assertEqual(rc, 141)

    def test_help_says_dp_is_not_derived(self):
        r = run(["--help"])
        self.assertEqual(r.returncode, 0)
        self.assertIn("the training dp is not derived from ep", r.stdout)
        self.assertNotIn("derived when ep needs it", r.stdout)

    def test_an_order_megatron_refuses_is_refused(self):
        r = run(["--model", "qwen3-30b-a3b", "--train", "tp=4,dp=2,pp=2,ep=2,order=tp-cp-ep-pp-dp",
                 "--infer", "tp=4"])
        self.assertEqual(r.returncode, 2)
        self.assertNotIn("Traceback", r.stderr)
        self.assertIn("with pp not last, megatron-core needs the expert data parallel size", r.stderr)

    def test_infer_quant_makes_every_linear_weight_fp8_and_nothing_else(self):
        r = run(["--model", "deepseek-v3", "--scale", "16", "--train", "tp=1,pp=4,ep=4,dp=4",
                 "--infer", "tp=4,dp=4", "--infer-quant", "block128"])
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = json.loads(r.stdout)
        self.assertEqual(doc["meta"]["infer_quant"], "block128")
        fp8 = {t["name"] for t in doc["tensors"] if t.get("dst_dtype") == "fp8e4m3"}
        for t in doc["tensors"]:
            linear = len(t["shape"]) == 2 and t["name"].endswith(("_proj.weight", "_mqa.weight"))
            self.assertEqual(t["name"] in fp8, linear, t["name"])
            self.assertEqual("quant=block(128,128)" in t["dst"], linear, t["name"])
            self.assertNotIn("quant", t["src"])
        for name in ("model.layers.0.self_attn.q_b_proj.weight",
                     "model.layers.5.mlp.experts.3.down_proj.weight",
                     "model.layers.0.mlp.gate_up_proj.weight"):
            self.assertIn(name, fp8)
        for name in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.5.mlp.gate.weight",
                     "model.layers.0.input_layernorm.weight"):
            self.assertNotIn(name, fp8)

    def test_infer_quant_takes_only_what_it_knows(self):
        r = run(LLAMA + ["--infer-quant", "block64"])
        self.assertEqual(r.returncode, 2)
        self.assertNotIn("Traceback", r.stderr)
        self.assertIn("invalid choice: 'block64'", r.stderr)


if __name__ == "__main__":
    unittest.main()
