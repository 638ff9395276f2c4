#!/usr/bin/python3
"""bench_torch.py - the PyTorch side of the model benchmark (run by scripts/bench.sh when
Debian's python3-torch is installed): the same decoder as tests/fixtures/gen_model_fixtures.py,
on the same configs and batches as scripts/bench_model.lua, with the same thread count and
OpenBLAS core type, one config per process (so that the peak memory is that config's):
    bench_torch.py small|large|qwenvocab|qwen05b
prints lines like bench_model.lua:
    torch <name> train_tokens_per_s|score_tokens_per_s|sample_tokens_per_s|peak_rss_mb <value>
Training: forward + backward + AdamW. Scoring: forward and the log-probability of every next
token, without autograd. Sampling: batch 16, prompts of 16 tokens, `new` new tokens (one prefill
and new - 1 decode steps), a key/value cache, temperature 1. Peak: VmHWM at the end.
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

CONFIGS = {
    "small": dict(vocab=256, dim=128, layers=4, heads=4, ffn=384, T=256, B=16, new=128,
                  train_reps=7, sample_reps=3),
    "large": dict(vocab=256, dim=512, layers=8, heads=8, ffn=1536, T=256, B=8, new=128,
                  train_reps=7, sample_reps=3),
    "qwenvocab": dict(vocab=151936, dim=256, layers=4, heads=4, ffn=768, T=256, B=2, new=16,
                      train_reps=3, sample_reps=3),
    "qwen05b": dict(vocab=151936, dim=896, layers=24, heads=14, kv_heads=2, ffn=4864, T=256,
                    B=2, new=32, train_reps=2, sample_reps=1, qwen2=True),
}


def full_config(c):
    qwen2 = c.get("qwen2", False)
    return dict(arch="Qwen2ForCausalLM" if qwen2 else "LlamaForCausalLM", vocab=c["vocab"],
                dim=c["dim"], layers=c["layers"], heads=c["heads"],
                kv_heads=c.get("kv_heads", c["heads"]), head_dim=c["dim"] // c["heads"],
                ffn=c["ffn"], ctx=c["T"] + 128, theta=1e6 if qwen2 else 10000.0,
                eps=1e-6 if qwen2 else 1e-5, tie=True, qkv_bias=qwen2, qk_norm=False)


def init(c):
    gen = torch.Generator().manual_seed(1)
    params = {}
    for name, shape in ref.param_shapes(c):
        if "norm" in name:
            t = torch.ones(shape)
        elif len(shape) == 1:
            t = torch.zeros(shape)
        else:
            t = 0.02 * torch.randn(shape, generator=gen)
        params[name] = t.requires_grad_(True)
    return params


def batch(c, B, T):
    tokens = torch.randint(0, c["vocab"], (B, T), generator=torch.Generator().manual_seed(42))
    lengths = [T] * B
    return tokens, lengths, ref.targets_of(tokens, lengths)


def train(c, P, B, T, reps):
    tokens, lengths, targets = batch(c, B, T)
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
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        rates.append(B * T / (time.perf_counter() - t0))
    return statistics.median_low(rates)


@torch.no_grad()
def score(c, P, B, T, reps):
    """Forward and the log-probability of every next token (what moonrl's forward_batch gives)."""
    tokens, lengths, targets = batch(c, B, T)

    def run():
        logp = torch.log_softmax(ref.forward(c, P, tokens, lengths), -1)
        return logp.gather(-1, targets.clamp(min=0)[..., None])[..., 0] * (targets >= 0)

    run()
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        rates.append(B * T / (time.perf_counter() - t0))
    return statistics.median_low(rates)


@torch.no_grad()
def sample(c, P, new, reps, prompt_len=16, batch=16):
    """Incremental decoding with a key/value cache, written out for this architecture."""
    hd, H, KV = c["head_dim"], c["heads"], c["kv_heads"]
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, c["vocab"], (batch, prompt_len), generator=gen)
    inv = 1.0 / (c["theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))

    def rope(x, pos):  # x (B, H, n, hd)
        ang = pos[:, None].float() * inv[None, :]
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
        half = hd // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

    def proj(h, p, name):
        y = h @ P[p + f"self_attn.{name}.weight"].T
        return y + P[p + f"self_attn.{name}.bias"] if c["qkv_bias"] else y

    def run(ids, cache, start):
        Bn, n = ids.shape
        pos = torch.arange(start, start + n)
        x = P["model.embed_tokens.weight"][ids]
        for i in range(c["layers"]):
            p = f"model.layers.{i}."
            h = ref.rmsnorm(x, P[p + "input_layernorm.weight"], c["eps"])
            q = proj(h, p, "q_proj").view(Bn, n, H, hd).transpose(1, 2)
            k = proj(h, p, "k_proj").view(Bn, n, KV, hd).transpose(1, 2)
            v = proj(h, p, "v_proj").view(Bn, n, KV, hd).transpose(1, 2)
            q, k = rope(q, pos), rope(k, pos)
            if cache[i] is not None:
                k = torch.cat([cache[i][0], k], 2)
                v = torch.cat([cache[i][1], v], 2)
            cache[i] = (k, v)
            if KV != H:
                k = k.repeat_interleave(H // KV, dim=1)
                v = v.repeat_interleave(H // KV, dim=1)
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
        for k in range(new):
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)
            if k + 1 < new:
                logits = run(nxt, cache, prompt_len + k)
        return batch * new

    generate()
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        n = generate()
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median_low(rates)


def peak_rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main():
    torch.set_num_threads(int(os.environ.get("MOONRL_BENCH_THREADS", os.cpu_count() or 1)))
    if len(sys.argv) != 2 or sys.argv[1] not in CONFIGS:
        sys.exit("usage: bench_torch.py " + "|".join(CONFIGS))
    name = sys.argv[1]
    bc = CONFIGS[name]
    c = full_config(bc)
    P = init(c)

    def out(metric, value):
        print(f"torch\t{name}\t{metric}\t{value:.1f}", flush=True)

    out("train_tokens_per_s", train(c, P, bc["B"], bc["T"], bc["train_reps"]))
    out("score_tokens_per_s", score(c, P, bc["B"], bc["T"], bc["train_reps"]))
    out("sample_tokens_per_s", sample(c, P, bc["new"], bc["sample_reps"]))
    out("peak_rss_mb", peak_rss_mb())


if __name__ == "__main__":
    main()
