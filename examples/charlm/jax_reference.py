"""The model of `examples/train_charlm.rs` written in JAX, for side-by-side figures.

The same corpus and split, the same windows in the same order (SplitMix64
starts), the same GPT (W10's architecture, GPT-2 initialization, dropout on
the embeddings and residual branches), AdamW with the same warm-up and
cosine schedule, and the same validation measure (windows overlapping by
one). Weights are drawn from numpy, not `Tensor::randn`, so runs agree in
distribution, not bit for bit. Prints each epoch's training and validation
bits per character and the tokens per second, as the Rust example does.

    taskset -c 0-1 python examples/charlm/jax_reference.py --epochs 1 [--bf16]

Needs `jax` (the peers' environment of `bench_peers.py` has it).
"""
import argparse
import math
import os
import time
import numpy as np
import jax, jax.numpy as jnp

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=None, help="stop each epoch after N steps")
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "war_and_peace.txt"))
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--lr", type=float, default=4e-3)
ap.add_argument("--beta2", type=float, default=0.999)
ap.add_argument("--dropout", type=float, default=0.05)
ap.add_argument("--weight-decay", type=float, default=0.01)
ap.add_argument("--seed", type=int, default=0, help="seeds the windows (as the Rust example), the weights and dropout")
ap.add_argument("--bf16", action="store_true", help="products on bf16 operands, f32 accumulation")
a = ap.parse_args()

raw = open(a.data, "rb").read()
alpha = sorted(set(raw)); idx = {b: i for i, b in enumerate(alpha)}
ids = np.array([idx[b] for b in raw], np.int32)
split = len(ids) - int(round(len(ids) * 0.1))
train, valid = ids[:split], ids[split:]
V, T, D, H, NB = len(alpha), 128, 256, 4, 2
B = a.batch
M64 = (1 << 64) - 1
def splitmix(z):
    z = (z + 0x9e3779b97f4a7c15) & M64
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
    return z ^ (z >> 31)
span = len(train) - T
def batch(epoch, k):
    rows = []
    for r in range(B):
        key = ((a.seed * 0x100000001b3) & M64) ^ (epoch << 40) ^ (k * B + r)
        s = splitmix(key) % (span + 1)
        rows.append(train[s:s + T])
    return np.stack(rows)

rng = np.random.default_rng(a.seed)
n = lambda shape, sc: jnp.asarray(rng.standard_normal(shape).astype(np.float32) * sc)
res = 0.02 / math.sqrt(2 * NB)
P = {"tok": n((V, D), 0.02), "pos": n((T, D), 0.01), "lng": jnp.ones(D), "lnb": jnp.zeros(D), "head": n((D, V), 0.02)}
for i in range(NB):
    P[f"b{i}"] = dict(g1=jnp.ones(D), b1=jnp.zeros(D), wqkv=n((D, 3 * D), 0.02), bqkv=jnp.zeros(3 * D),
                      wo=n((D, D), res), bo=jnp.zeros(D), g2=jnp.ones(D), b2=jnp.zeros(D),
                      wfc=n((D, 4 * D), 0.02), bfc=jnp.zeros(4 * D), wpr=n((4 * D, D), res), bpr=jnp.zeros(D))

def mm(x, w):
    if a.bf16:
        return jnp.matmul(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
    return x @ w
def ln(x, g, b):
    mu = x.mean(-1, keepdims=True); d = x - mu
    return d / jnp.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * g + b
def gelu(u): return 0.5 * u * (1 + jnp.tanh(0.7978845608 * (u + 0.044715 * u ** 3)))
def drop(x, key, p):
    if key is None or p == 0: return x
    keep = jax.random.bernoulli(key, 1 - p, x.shape)
    return jnp.where(keep, x / (1 - p), 0.0)
def forward(P, tok, key, p):
    t = tok.shape[1]
    keys = list(jax.random.split(key, 1 + 2 * NB)) if key is not None else [None] * (1 + 2 * NB)
    h = drop(P["tok"][tok] + P["pos"][:t], keys[0], p)
    mask = jnp.tril(jnp.ones((t, t), bool))
    for i in range(NB):
        q = P[f"b{i}"]
        qkv = mm(ln(h, q["g1"], q["b1"]), q["wqkv"]) + q["bqkv"]
        sp = lambda z: z.reshape(z.shape[0], t, H, D // H).transpose(0, 2, 1, 3)
        Q, K, Vv = sp(qkv[..., :D]), sp(qkv[..., D:2 * D]), sp(qkv[..., 2 * D:])
        s = jnp.einsum("bhqd,bhkd->bhqk", Q, K) / math.sqrt(D // H)
        s = jnp.where(mask, s, -jnp.inf)
        o = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, -1), Vv).transpose(0, 2, 1, 3).reshape(-1, t, D)
        h = h + drop(mm(o, q["wo"]) + q["bo"], keys[1 + 2 * i], p)
        u = gelu(mm(ln(h, q["g2"], q["b2"]), q["wfc"]) + q["bfc"])
        h = h + drop(mm(u, q["wpr"]) + q["bpr"], keys[2 + 2 * i], p)
    return mm(ln(h, P["lng"], P["lnb"]), P["head"])
def loss(P, tok, key, p):
    lg = forward(P, tok, key, p)[:, :-1]
    lp = jax.nn.log_softmax(lg, -1)
    return -jnp.take_along_axis(lp, tok[:, 1:, None], -1).mean()

steps_per_epoch = min(len(train) // (B * T), a.steps or len(train))
total = max(a.epochs * steps_per_epoch, 101)
def lr_at(t):
    cos = lambda s: a.lr * ((1 - 0.1) * 0.5 * (1 + jnp.cos(jnp.pi * jnp.minimum(s, total) / total)) + 0.1)
    return jnp.where(t < 100, cos(0.0) * (t + 1) / 100, cos(t - 100.0))

@jax.jit
def step(P, m, v, t, tok, key):
    l, g = jax.value_and_grad(loss)(P, tok, key, a.dropout)
    lr = lr_at(t); b1, b2 = 0.9, a.beta2
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
    c1, c2 = 1 - b1 ** (t + 1), 1 - b2 ** (t + 1)
    P = jax.tree.map(lambda p, m, v: p - lr * ((m / c1) / (jnp.sqrt(v / c2) + 1e-8) + a.weight_decay * p), P, m, v)
    return P, m, v, l

@jax.jit
def evalsum(P, tok): return loss(P, tok, None, 0.0) * tok.shape[0]
def valid_bpc(P):
    ws = [valid[s:s + T] for s in range(0, len(valid) - 1, T - 1)]
    full = [w for w in ws if len(w) == T]; tail = [w for w in ws if len(w) != T]
    nats = cnt = 0.0
    groups = [full[i:i + 32] for i in range(0, len(full), 32)] + [[w] for w in tail]
    for g in groups:
        L = len(g[0])
        if L < 2: continue
        s = float(evalsum(P, jnp.asarray(np.stack(g))))
        nats += s * (L - 1); cnt += len(g) * (L - 1)
    return nats / cnt / math.log(2)

m = jax.tree.map(jnp.zeros_like, P); vv = jax.tree.map(jnp.zeros_like, P)
key = jax.random.PRNGKey(a.seed)
t = 0
for e in range(a.epochs):
    t0 = time.time(); s = 0.0
    for k in range(steps_per_epoch):
        key, sub = jax.random.split(key)
        P, m, vv, l = step(P, m, vv, jnp.float32(t), jnp.asarray(batch(e, k)), sub)
        s += float(l); t += 1
        if t == 1:
            print(f"first step (with its compile): {time.time() - t0:.2f} s", flush=True)
            t1 = time.time()
    dt = time.time() - t0
    steady = (steps_per_epoch - 1) * B * T / (time.time() - t1) if e == 0 and steps_per_epoch > 1 else steps_per_epoch * B * T / dt
    print(f"epoch {e + 1}/{a.epochs}  train {s / steps_per_epoch / math.log(2):.3f} bpc  |  validation {valid_bpc(P):.3f} bpc"
          f"  ({steps_per_epoch * B * T / dt:.0f} tokens/s, {steady:.0f} after the first step; {dt:.1f} s)", flush=True)
