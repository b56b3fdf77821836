#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What delta refits send for realistic updates (docs/delta.md).

A small MLP stack (the hidden sizes of a 4-layer transformer MLP, 512 -> 2048 -> 512, with
GPT-2's published initialisation: N(0, 0.02) weights, zero biases) is trained with Adam
(beta 0.9 / 0.999, eps 1e-8) on a teacher-student regression task: real gradients, by hand
back-propagation, on FP32 master weights. After each step the weights are cast to BF16 (round
to nearest even), as an RL trainer does before a refit, and the script reports, per learning
rate, the fraction of BF16 elements that changed and the bytes a delta refit sends for it:
each 4 MiB chunk (2M elements, in order) as the smallest of a 16-byte header, a bitmap or runs
with the changed elements, or dense, exactly as plugin/exec/delta.c chooses. Relative to a
full refit (every byte). Steps 1..WARMUP are not counted (Adam's first steps move every weight
by about lr whatever its gradient).

usage: scripts/delta-adam.py [--lrs 1e-6,1e-5,1e-4] [--steps 8] [--warmup 3] [--layers 4]
"""
import argparse

import numpy as np

CHUNK = 2 << 20  # bf16 elements per 4 MiB chunk
HDR = 16


def bf16_bits(w):
    """FP32 -> the BF16 bit pattern (round to nearest even), as uint16."""
    u = w.astype(np.float32).view(np.uint32)
    rounding = ((u >> 16) & 1) + 0x7FFF
    return ((u + rounding) >> 16).astype(np.uint16)


def chunk_bytes(changed):
    """Bytes the encoder sends for one chunk's boolean change mask."""
    n = changed.size
    nc = int(changed.sum())
    if nc == 0:
        return HDR
    starts = int(np.count_nonzero(changed[1:] & ~changed[:-1])) + int(changed[0])
    bitmap = HDR + (n + 63) // 64 * 8 + nc * 2
    runs = HDR + starts * 8 + nc * 2
    return min(bitmap, runs, n * 2)


def delta_bytes(changed):
    flat = changed.ravel()
    return sum(chunk_bytes(flat[i:i + CHUNK]) for i in range(0, flat.size, CHUNK))


def gelu(x):
    return 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))


def gelu_grad(x):
    t = np.tanh(0.7978845608 * (x + 0.044715 * x ** 3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608 * (1 + 3 * 0.044715 * x * x)


def make(rng, layers, d, h):
    params = []
    for _ in range(layers):
        params += [rng.normal(0, 0.02, (d, h)).astype(np.float32), np.zeros(h, np.float32),
                   rng.normal(0, 0.02, (h, d)).astype(np.float32), np.zeros(d, np.float32)]
    return params


def forward_backward(params, x, y):
    """Residual MLP blocks; MSE loss; gradients of every parameter."""
    acts, a = [], x
    for i in range(0, len(params), 4):
        w1, b1, w2, b2 = params[i:i + 4]
        z = a @ w1 + b1
        g = gelu(z)
        acts.append((a, z, g))
        a = a + g @ w2 + b2
    diff = a - y
    loss = float((diff ** 2).mean())
    da = 2 * diff / diff.size
    grads = [None] * len(params)
    for k in range(len(acts) - 1, -1, -1):
        a_in, z, g = acts[k]
        w1, _, w2, _ = params[4 * k:4 * k + 4]
        grads[4 * k + 2] = g.T @ da
        grads[4 * k + 3] = da.sum(0)
        dz = (da @ w2.T) * gelu_grad(z)
        grads[4 * k] = a_in.T @ dz
        grads[4 * k + 1] = dz.sum(0)
        da = da + dz @ w1.T
    return loss, grads


def run(lr, args):
    rng = np.random.default_rng(1234)
    d, h = 512, 2048
    student = make(rng, args.layers, d, h)
    teacher = make(rng, args.layers, d, h)
    m = [np.zeros_like(p) for p in student]
    v = [np.zeros_like(p) for p in student]
    prev = [bf16_bits(p) for p in student]
    total = sum(p.size for p in student)
    rows = []
    for step in range(1, args.steps + 1):
        x = rng.normal(0, 1, (args.batch, d)).astype(np.float32)
        y, _ = x, None
        a = x
        for i in range(0, len(teacher), 4):
            w1, b1, w2, b2 = teacher[i:i + 4]
            a = a + gelu(a @ w1 + b1) @ w2 + b2
        y = a
        loss, grads = forward_backward(student, x, y)
        for i, (p, g) in enumerate(zip(student, grads)):
            m[i] = 0.9 * m[i] + 0.1 * g
            v[i] = 0.999 * v[i] + 0.001 * g * g
            mh = m[i] / (1 - 0.9 ** step)
            vh = v[i] / (1 - 0.999 ** step)
            p -= (lr * mh / (np.sqrt(vh) + 1e-8)).astype(np.float32)
        cur = [bf16_bits(p) for p in student]
        changed = [c != q for c, q in zip(cur, prev)]
        prev = cur
        if step <= args.warmup:
            continue
        frac = sum(int(c.sum()) for c in changed) / total
        sent = sum(delta_bytes(c) for c in changed) / (2 * total)
        rows.append((step, loss, frac, sent))
    return total, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lrs", default="1e-6,1e-5,1e-4")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    print("| lr | parameters | steps counted | changed per step (mean) | delta bytes / full (mean) |")
    print("|---|---|---|---|---|")
    for lr in (float(s) for s in args.lrs.split(",")):
        total, rows = run(lr, args)
        frac = np.mean([r[2] for r in rows])
        sent = np.mean([r[3] for r in rows])
        print(f"| {lr:g} | {total} | {len(rows)} | {100 * frac:.2f}% | {sent:.3f} |")


if __name__ == "__main__":
    main()
