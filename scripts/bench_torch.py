#!/usr/bin/python3
"""bench_torch.py - the PyTorch side of the model benchmark (run by scripts/bench.sh when
Debian's python3-torch is installed): the same decoder as tests/fixtures/gen_model_fixtures.py,
on the same configs and batches as scripts/bench_model.lua, with the same thread count and
OpenBLAS core type. Prints lines like bench_model.lua:
    torch <name> train_tokens_per_s <median>
    torch <name> sample_tokens_per_s <median>
Training: forward + backward + AdamW. Sampling: batch 16, prompts of 16 tokens, 128 new tokens,
a key/value cache, temperature 1.
"""
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "fixtures"))
import gen_model_fixtures as ref  # noqa: E402  (the reference implementation of the decoder)

CONFIGS = [
    dict(name="small", vocab=256, dim=128, layers=4, heads=4, ffn=384, T=256, B=16),
    dict(name="large", vocab=256, dim=512, layers=8, heads=8, ffn=1536, T=256, B=8),
]


def full_config(c):
    return dict(arch="LlamaForCausalLM", vocab=c["vocab"], dim=c["dim"], layers=c["layers"],
                heads=c["heads"], kv_heads=c["heads"], head_dim=c["dim"] // c["heads"],
                ffn=c["ffn"], ctx=c["T"] + 128, theta=10000.0, eps=1e-5, tie=True,
                qkv_bias=False, qk_norm=False)


def init(c):
    gen = torch.Generator().manual_seed(1)
    params = {}
    for name, shape in ref.param_shapes(c):
        t = torch.ones(shape) if "norm" in name else 0.02 * torch.randn(shape, generator=gen)
        params[name] = t.requires_grad_(True)
    return params


def train(c, P, B, T):
    tokens = torch.randint(0, c["vocab"], (B, T), generator=torch.Generator().manual_seed(42))
    lengths = [T] * B
    targets = ref.targets_of(tokens, lengths)
    decay = [v for v in P.values() if v.dim() == 2]
    rest = [v for v in P.values() if v.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}], lr=1e-4, betas=(0.9, 0.95))

    def step():
        opt.zero_grad()
        loss = ref.masked_ce(ref.forward(c, P, tokens, lengths), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(P.values()), 1.0)
        opt.step()

    step()
    rates = []
    for _ in range(7):
        t0 = time.perf_counter()
        step()
        rates.append(B * T / (time.perf_counter() - t0))
    return statistics.median(rates)


@torch.no_grad()
def sample(c, P, prompt_len=16, new=128, batch=16):
    """Incremental decoding with a key/value cache, written out for this architecture."""
    hd, H = c["head_dim"], c["heads"]
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, c["vocab"], (batch, prompt_len), generator=gen)
    inv = 1.0 / (c["theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))

    def rope(x, pos):  # x (B, H, n, hd)
        ang = pos[:, None].float() * inv[None, :]
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
        half = hd // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

    def run(ids, cache, start):
        Bn, n = ids.shape
        pos = torch.arange(start, start + n)
        x = P["model.embed_tokens.weight"][ids]
        for i in range(c["layers"]):
            p = f"model.layers.{i}."
            h = ref.rmsnorm(x, P[p + "input_layernorm.weight"], c["eps"])
            q = (h @ P[p + "self_attn.q_proj.weight"].T).view(Bn, n, H, hd).transpose(1, 2)
            k = (h @ P[p + "self_attn.k_proj.weight"].T).view(Bn, n, H, hd).transpose(1, 2)
            v = (h @ P[p + "self_attn.v_proj.weight"].T).view(Bn, n, H, hd).transpose(1, 2)
            q, k = rope(q, pos), rope(k, pos)
            if cache[i] is not None:
                k = torch.cat([cache[i][0], k], 2)
                v = torch.cat([cache[i][1], v], 2)
            cache[i] = (k, v)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            if n > 1:
                s = s + torch.triu(torch.full((n, n), float("-inf")), 1)
            o = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(Bn, n, H * hd)
            x = x + o @ P[p + "self_attn.o_proj.weight"].T
            h = ref.rmsnorm(x, P[p + "post_attention_layernorm.weight"], c["eps"])
            g = h @ P[p + "mlp.gate_proj.weight"].T
            u = h @ P[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(g) * u) @ P[p + "mlp.down_proj.weight"].T
        x = ref.rmsnorm(x[:, -1], P["model.norm.weight"], c["eps"])
        return x @ P["model.embed_tokens.weight"].T

    def generate():
        cache = [None] * c["layers"]
        logits = run(tokens, cache, 0)
        out = []
        for k in range(new):
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)
            out.append(nxt)
            logits = run(nxt, cache, prompt_len + k)
        return batch * new

    generate()
    rates = []
    for _ in range(3):
        t0 = time.perf_counter()
        n = generate()
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


def main():
    torch.set_num_threads(int(os.environ.get("MOONRL_BENCH_THREADS", os.cpu_count() or 1)))
    only = sys.argv[1] if len(sys.argv) > 1 else None
    for bc in CONFIGS:
        if only and bc["name"] != only:
            continue
        c = full_config(bc)
        P = init(c)
        print(f"torch\t{bc['name']}\ttrain_tokens_per_s\t{train(c, P, bc['B'], bc['T']):.1f}",
              flush=True)
        print(f"torch\t{bc['name']}\tsample_tokens_per_s\t{sample(c, P):.1f}", flush=True)


if __name__ == "__main__":
    main()
