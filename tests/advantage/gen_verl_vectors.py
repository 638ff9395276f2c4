#!/usr/bin/env python3
"""gen_verl_vectors.py - an independent NumPy reference for the estimators and losses that verl
1dda039 changed or added since the advantage spec's source (verl b178a3cd), and the test vectors
it writes: tests/advantage/verl_vectors.json, which tests/lua/verl_spec.lua runs through
rl.advantage.<method> (rtol 1e-5, atol 1e-6). The formulas are those of verl_1dda039.md beside
this file, written from reading verl's verl/trainer/ppo/core_algos.py and rollout_corr_helper.py;
nothing here is verl's code.

Run once with Debian's python3-numpy (make test does not need it):
    /usr/bin/python3 tests/advantage/gen_verl_vectors.py
Everything is float64; per-token outputs are 0 at mask-0 positions (the binding computes them on
sampled tokens only); an output named "error" holds a substring of the expected refusal.
"""
import json
import math
import os

import numpy as np

EPS_GRPO = 1e-6

# ---------------------------------------------------------------- masked primitives (spec 0.3)


def msum(x, m, axis=None):
    return np.where(m != 0, x, 0.0).sum(axis=axis)


def mmean(x, m, axis=None):
    return msum(x, m, axis) / (m.sum(axis=axis) + 1e-8)


def mwhiten(x, m):
    n = m.sum()
    if n < 2:
        raise ValueError("mask: whitening needs 2 tokens")
    mean = mmean(x, m)
    var = mmean((x - mean) ** 2, m) * n / (n - 1)
    return (x - mean) / np.sqrt(var + 1e-8)


def agg(loss, m, mode, scale=None):
    """verl's agg_loss on one rank (1dda039): the sum-norm mode averages over non-empty rows."""
    rows_with = (m.sum(axis=1) > 0).astype(float)
    if mode == "token-mean":
        return msum(loss, m) / m.sum() if m.sum() > 0 else 0.0
    if mode == "token-sum":
        return msum(loss, m)
    if mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        seq = msum(loss, m, axis=1)
        out = (seq * rows_with).sum() / rows_with.sum() if rows_with.sum() > 0 else 0.0
        if mode == "seq-mean-token-sum-norm":
            out /= scale if scale else m.shape[1]
        return out
    if mode == "seq-mean-token-mean":
        seq = msum(loss, m, axis=1) / (m.sum(axis=1) + 1e-8)
        return (seq * rows_with).sum() / rows_with.sum() if rows_with.sum() > 0 else 0.0
    raise ValueError(mode)


def agg_weights(m, mode, scale=None):
    """d agg / d loss[b, t]: what a token-sum gradient is multiplied by."""
    rows, cols = m.shape
    w = np.zeros_like(m)
    n_rows = (m.sum(axis=1) > 0).sum()
    for b in range(rows):
        for t in range(cols):
            if m[b, t] == 0:
                continue
            if mode == "token-mean":
                w[b, t] = 1.0 / m.sum()
            elif mode == "token-sum":
                w[b, t] = 1.0
            elif mode == "seq-mean-token-sum":
                w[b, t] = 1.0 / n_rows
            elif mode == "seq-mean-token-sum-norm":
                w[b, t] = 1.0 / (n_rows * (scale if scale else cols))
            elif mode == "seq-mean-token-mean":
                w[b, t] = 1.0 / ((m[b].sum() + 1e-8) * n_rows)
    return w


def grpo_term(score, index, eps=EPS_GRPO, by_std=True):
    """verl's GRPO on row scores: groups of one keep their score (mean 0, std 1)."""
    out = np.zeros_like(score)
    for g in set(index):
        idx = [i for i, x in enumerate(index) if x == g]
        s = score[idx]
        mu, sd = (0.0, 1.0) if len(idx) == 1 else (s.mean(), s.std(ddof=1))
        out[idx] = (s - mu) / (sd + eps) if by_std else s - mu
    return out

# ---------------------------------------------------------------- estimators


def reinforce_pp(r, m, gamma, reset=False):
    rows, cols = r.shape
    ret = np.zeros_like(r)
    for b in range(rows):
        run = 0.0
        for t in reversed(range(cols)):
            new = r[b, t] + gamma * run
            if reset:  # before verl 8a1bf6d5b
                ret[b, t] = new
                run = new * m[b, t]
            else:  # verl 1dda039
                ret[b, t] = new * m[b, t]
                run = new * m[b, t] + run * (1 - m[b, t])
    return mwhiten(ret, m) * m, ret


def gdpo(terms, m, index, weights=None, eps=EPS_GRPO, by_std=True):
    total = np.zeros(m.shape[0])
    for k, term in enumerate(terms):
        w = 1.0 if weights is None else weights[k]
        total += w * grpo_term(np.asarray(term, float), index, eps, by_std)
    tok = total[:, None] * m
    return mwhiten(tok, m) * m


def otb(r, m, index, old, spq, isw=None, zero_tail=True, eps=1e-8, multi_turn=False):
    """verl's compute_optimal_token_baseline_advantage and, multi_turn, its tir_ variant."""
    rows, cols = r.shape
    G = np.flip(np.cumsum(np.flip(r * m, 1), 1), 1)
    w = 1 - 2 * np.exp(old) + spq
    if isw is not None:
        w = w * isw ** 2
    W = np.cumsum(w * m, 1)
    if multi_turn:  # pack each row's mask-1 steps to the left
        lens = m.sum(1).astype(int)
        Wc, Rc = np.zeros((rows, cols)), np.zeros((rows, cols))
        for b in range(rows):
            sel = m[b] != 0
            Wc[b, :lens[b]] = W[b, sel]
            Rc[b, :lens[b]] = G[b, sel]
        B = np.zeros((rows, cols))
        for g in set(index):
            idx = [i for i in range(rows) if index[i] == g and lens[i] > 0]
            if len(idx) < 2:
                continue
            bstar = (Rc[idx] * Wc[idx]).sum(0) / (Wc[idx].sum(0) + eps)
            B[idx] = bstar
            if zero_tail:
                L = sorted(lens[idx])
                top = [i for i in idx if lens[i] == L[-1]]
                if len(top) == 1 and L[-1] > L[-2]:
                    B[top[0], L[-2]:] = 0.0
        adv = np.zeros((rows, cols))
        for b in range(rows):
            adv[b, m[b] != 0] = (Rc[b] - B[b])[:lens[b]]
        return adv * m, G
    B = np.zeros((rows, cols))
    lens = m.sum(1).astype(int)
    for g in set(index):
        idx = [i for i in range(rows) if index[i] == g]
        if len(idx) < 2:
            continue
        num = (G[idx] * W[idx] * m[idx]).sum(0)
        den = (W[idx] * m[idx]).sum(0) + eps
        B[idx] = num / den
        if zero_tail:
            L = sorted(lens[idx])
            top = [i for i in idx if lens[i] == L[-1]]
            if len(top) == 1 and L[-1] > L[-2]:
                B[top[0], L[-2]:] = 0.0
    return (G - B) * m, G

# ---------------------------------------------------------------- policy losses


def pg(kind, old, lp, adv, m, isw=None, mode="token-mean", scale=None, lo=0.2, hi=0.2, c=None,
       clip_cov=(2e-4, 1.0, 5.0), kl_cov=(2e-4, 0.1), beta=None):
    """Per-token loss l, per-token derivative g = dl/dlogp (IS weights included), metrics."""
    x = lp - old
    xc = np.clip(x, -20, 20)
    r = np.exp(xc)
    out = {}
    if kind in ("dppo_tv", "dppo_kl"):
        c = 3.0 if c is None else c  # ActorConfig's clip_ratio_c (the function's 20 is unused)
        tr = np.minimum(r, c)
        p, q = np.exp(lp), np.exp(old)
        if kind == "dppo_tv":
            inside = np.where(adv > 0, p - q <= hi, p - q >= -lo)
        else:
            k = q * (old - lp) + (1 - q) * np.log((1 - q + 1e-8) / (1 - p + 1e-8))
            inside = np.where(adv > 0, (k <= hi) | (p <= q), (k <= lo) | (p >= q))
        v = inside.astype(float)
        l = -adv * tr * lp * v
        g = -adv * tr * v
        out["pg_clipfrac"] = mmean(1 - v, m)
        out["pg_clipfrac_lower"] = mmean((r > c) * v, m)
        out["ppo_kl"] = mmean(-xc, m)
    elif kind == "clip_cov":
        ratio, lb, ub = clip_cov
        ru = np.exp(x)
        l1, l2 = -adv * ru, -adv * np.clip(ru, 1 - lo, 1 + hi)
        cov = (adv - mmean(adv, m)) * (lp - mmean(lp, m))
        cand = (m != 0) & ~(l2 > l1) & (cov > lb) & (cov < ub)
        want = max(int(ratio * m.sum()), 1)
        assert cand.sum() <= want, "the vectors keep clip-cov's choice deterministic"
        corr = np.where(cand, 0.0, 1.0)
        l = np.maximum(l1, l2) * corr
        g = np.where(l2 > l1, 0.0, -adv * ru) * corr
        out["pg_clipfrac"] = mmean((corr == 0).astype(float), m)
        out["ppo_kl"] = mmean(-x, m)
    elif kind == "kl_cov":
        ratio, coef = kl_cov
        ru = np.exp(x)
        valid = np.flatnonzero(m.reshape(-1) != 0)
        a, logp = adv.reshape(-1)[valid], lp.reshape(-1)[valid]
        cov = (a - a.mean()) * (logp - logp.mean())
        k = max(1, int(len(valid) * ratio))
        assert len(set(np.round(cov, 12))) == len(cov), "no ties"
        chosen = np.zeros(m.size)
        chosen[valid[np.argsort(-cov)[:k]]] = 1
        chosen = chosen.reshape(m.shape)
        l = -adv * ru + chosen * kl_cov[1] * np.abs(x)
        g = -adv * ru + chosen * kl_cov[1] * np.sign(x)
        out["ppo_kl"] = mmean(np.abs(x), m)
    elif kind == "dro":
        l = -lp * adv + 0.5 * beta * x ** 2
        g = -adv + beta * x
    elif kind == "reinforce":
        l = -adv * lp
        g = -adv
        out["ppo_kl"] = mmean(-x, m)
    elif kind == "vanilla":
        cc = 3.0 if c is None else c
        l1, l2 = -adv * r, -adv * np.clip(r, 1 - lo, 1 + hi)
        lc = np.maximum(l1, l2)
        l3 = -adv * cc
        dual = (adv < 0) & (l3 < lc)
        l = np.where(dual, l3, lc)
        through = (x >= -20) & (x <= 20)
        g = np.where(dual | (l2 > l1), 0.0, -adv * r * through)
        out["pg_clipfrac"] = mmean((l2 > l1).astype(float), m)
        out["pg_clipfrac_lower"] = mmean(((lc > l3) & (adv < 0)).astype(float), m)
        out["ppo_kl"] = mmean(-xc, m)
    else:
        raise ValueError(kind)
    if isw is not None:
        l, g = l * isw, g * isw
    out["loss"] = agg(l, m, mode, scale)
    out["pg_losses"] = l * m
    out["grad_wrt_logp"] = np.where(m != 0, g, 0.0)
    out["_agg_grad"] = agg_weights(m, mode, scale) * out["grad_wrt_logp"]
    return out


def gmpo(old, lp, adv, m, isw=None, lo=0.4, hi=0.4):
    x = lp - old
    xc = np.clip(x, -lo, hi)
    s = np.sign(adv)
    xs = s * np.minimum(s * x, s * xc)
    n = m.sum(1)
    ratio = np.exp(msum(xs, m, 1) / (n + 1e-8))
    abar = msum(adv, m, 1) / (n + 1e-8)
    term = -abar * ratio
    if isw is not None:
        term = term * np.exp(msum(np.log(isw + 1e-10), m, 1) / (n + 1e-8))
    clipped = (x != xc).astype(float)
    return {"loss": term.mean(), "ppo_kl": mmean(-x, m),
            "pg_clipfrac": mmean(clipped * (adv > 0), m),
            "pg_clipfrac_lower": mmean(clipped * (adv < 0), m)}

# ---------------------------------------------------------------- rollout correction


def band(spec):
    """verl's threshold strings: "U" or "L_U"."""
    if isinstance(spec, (int, float)):
        return None, float(spec)
    if "_" in spec:
        lo, up = spec.split("_", 1)
        return float(lo), float(up)
    return None, float(spec)


def bkl(p, q):
    p, q = np.clip(p, 1e-6, 1 - 1e-6), np.clip(q, 1e-6, 1 - 1e-6)
    return p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q))


def rollout_corr(train, rollout, m, is_level=None, is_thr=2.0, normalize=False, rs=None,
                 rs_thr=None):
    rows, cols = m.shape
    if m.sum() == 0:
        raise ValueError("mask")
    lr = np.where(m != 0, train - rollout, 0.0)
    out = {"kl": mmean(-lr, m), "k3_kl": mmean(np.exp(lr) - lr - 1, m)}
    if is_level:
        lo, up = band(is_thr)
        if is_level == "token":
            raw = np.exp(np.clip(lr, -20, 20)) * m
        else:
            lsum = msum(lr, m, 1)
            raw = np.exp(np.clip(lsum, -20, 20))[:, None] * m
        w = np.where((raw >= lo) & (raw <= up), raw, 0.0) if lo else np.minimum(raw, up)
        low = lo if lo else 1.0 / up
        if is_level == "token":
            out["is_fraction_high"] = mmean((raw > up).astype(float), m)
            out["is_fraction_low"] = mmean((raw < low).astype(float), m)
        else:
            out["is_fraction_high"] = float((lsum > math.log(up)).mean())
            out["is_fraction_low"] = float((lsum < math.log(low)).mean())
        out["is_mean"] = mmean(w, m)
        if normalize:
            if is_level == "token":
                mean = mmean(w, m)
            else:
                seqw = msum(w, m, 1) / (m.sum(1) + 1e-8)
                has = (m.sum(1) > 0).astype(float)
                mean = (seqw * has).sum() / max(has.sum(), 1e-8)
            if mean > 1e-8:
                w = w / mean
            out["is_norm_factor"] = mean if mean > 1e-8 else 1.0
        out["rollout_is_weights"] = w
    keep = np.ones((rows, cols))
    if rs:
        names = [x.strip() for x in rs.split(",") if x.strip()]
        thrs = [x.strip() for x in str(rs_thr).split(",")] if isinstance(rs_thr, str) else [rs_thr]
        if len(thrs) == 1:
            thrs = thrs * len(names)
        x = np.clip(lr, -20, 20)
        stats = {"k1": -x, "k2": 0.5 * x ** 2, "k3": np.exp(x) - 1 - x}
        for name, thr in zip(names, thrs):
            lo, up = band(thr if isinstance(thr, (int, float)) else str(thr))
            if name.endswith("k1"):
                lo = lo if lo else 1.0 / up
                lo_v, up_v = math.log(lo), math.log(up)
            else:
                lo_v, up_v = -math.inf, up
            if name == "binary_kl":
                p, q = np.exp(train), np.exp(rollout)
                stat = np.maximum(bkl(p, q), bkl(q, p))
                ok = stat <= up_v
            elif name.startswith("token_"):
                stat = stats[name[-2:]]
                ok = (stat >= lo_v) & (stat <= up_v)
            else:
                st = stats[name[-2:]]
                if name.startswith("seq_sum"):
                    v = msum(st, m, 1)
                elif name.startswith("seq_mean"):
                    v = mmean(st, m, 1)
                else:
                    v = np.where(m.sum(1) > 0, np.where(m != 0, st, -np.inf).max(1), 0.0)
                ok = np.repeat(((v >= lo_v) & (v <= up_v))[:, None], cols, 1)
            keep = keep * ok
    final = m * keep
    out["rs_masked_fraction"] = mmean(1 - keep, m)
    out["rs_seq_masked_fraction"] = float((((1 - keep) * m).sum(1) > 0).mean())
    out["modified_response_mask"] = final
    return out

# ---------------------------------------------------------------- cases


RNG = np.random.default_rng(20260822)


def rnd(shape, lo, hi, digits=4):
    return np.round(RNG.uniform(lo, hi, size=shape), digits)


def tolist(x):
    if isinstance(x, np.ndarray):
        return [tolist(v) for v in x] if x.ndim > 1 else [enc(float(v)) for v in x]
    if isinstance(x, (list, tuple)):
        return [tolist(v) for v in x]
    if isinstance(x, (float, np.floating, int, np.integer)) and not isinstance(x, bool):
        return enc(float(x))
    return x


def enc(v):
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


CASES = []


def case(method, name, note, params, inputs, outputs):
    outputs = {k: v for k, v in outputs.items() if not k.startswith("_")}
    CASES.append({"method": method, "name": name, "note": note, "params": params,
                  "inputs": {k: tolist(v) for k, v in inputs.items()},
                  "outputs": {k: tolist(v) for k, v in outputs.items()}})


def error_case(method, name, note, params, inputs, substring):
    CASES.append({"method": method, "name": name, "note": note, "params": params,
                  "inputs": {k: tolist(v) for k, v in inputs.items()},
                  "outputs": {"error": substring}})


def ragged_mask(rows, cols, lengths):
    m = np.zeros((rows, cols))
    for b, n in enumerate(lengths):
        m[b, :n] = 1
    return m


def changed_rules():
    ones = np.ones((2, 2))
    case("agg_loss", "seq-mean-token-sum-norm_verl_example", "verl 1dda039: 1.0 (was 2.0)",
         {"mode": "seq-mean-token-sum-norm"}, {"loss_mat": ones, "loss_mask": ones},
         {"loss": agg(ones, ones, "seq-mean-token-sum-norm")})
    loss = rnd((4, 5), -2, 2)
    m = ragged_mask(4, 5, [5, 2, 0, 3])
    for mode, scale in (("seq-mean-token-sum-norm", 7.0), ("token-sum", None)):
        params = {"mode": mode}
        if scale:
            params["loss_scale_factor"] = scale
        case("agg_loss", mode + "_empty_row", "a row without tokens is not counted", params,
             {"loss_mat": loss, "loss_mask": m}, {"loss": agg(loss, m, mode, scale)})
    r = np.array([[0.0, 0.0, 1.0]])
    mk = np.array([[1.0, 0.0, 1.0]])
    adv, ret = reinforce_pp(r, mk, 1.0)
    case("reinforce_plus_plus", "verl_example_carry", "returns [1, 0, 1] (verl 1dda039)",
         {"gamma": 1.0}, {"token_level_rewards": r, "response_mask": mk},
         {"advantages": adv, "returns": ret})
    adv, ret = reinforce_pp(r, mk, 1.0, reset=True)
    case("reinforce_plus_plus", "verl_example_reset_at_mask", "the rule before 8a1bf6d5b: [0, 1, 1]",
         {"gamma": 1.0, "reset_at_mask": True}, {"token_level_rewards": r, "response_mask": mk},
         {"advantages": adv, "returns": ret})
    r = np.zeros((3, 6))
    r[0, 5], r[1, 2], r[2, 4], r[0, 1] = 1.0, 0.5, -1.0, 0.25
    mk = np.array([[1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 1, 1, 1, 0]], float)
    for gamma in (1.0, 0.9):
        adv, ret = reinforce_pp(r, mk, gamma)
        case("reinforce_plus_plus", "multiturn_carry_gamma_%g" % gamma,
             "rewards on mask-0 positions are dropped; the return crosses observations",
             {"gamma": gamma}, {"token_level_rewards": r, "response_mask": mk},
             {"advantages": adv, "returns": ret})
    # policy losses under the two changed / added modes
    old = rnd((3, 4), -2.5, -0.2)
    lp = old + rnd((3, 4), -0.3, 0.3)
    a = np.repeat(rnd((3, 1), -1.5, 1.5), 4, 1)
    m = ragged_mask(3, 4, [4, 0, 3])
    for mode in ("seq-mean-token-sum-norm", "token-sum"):
        o = pg("vanilla", old, lp, a, m, mode=mode)
        case("policy_loss_vanilla", "agg_" + mode, "an empty row: not counted",
             {"loss_agg_mode": mode}, {"old_log_prob": old, "log_prob": lp, "advantages": a,
                                       "response_mask": m},
             {"loss": o["loss"], "pg_clipfrac": o["pg_clipfrac"], "ppo_kl": o["ppo_kl"]})
    # GMPO with IS weights
    old = rnd((3, 5), -2.5, -0.2)
    lp = old + rnd((3, 5), -0.6, 0.6)
    a = np.repeat(np.array([[1.2], [-0.7], [0.4]]), 5, 1)
    m = ragged_mask(3, 5, [5, 3, 4])
    w = rnd((3, 5), 0.3, 2.0)
    for name, isw in (("is_weights", w), ("no_is_weights", None)):
        inputs = {"old_log_prob": old, "log_prob": lp, "advantages": a, "response_mask": m}
        if isw is not None:
            inputs["rollout_is_weights"] = isw
        case("policy_loss_geo_mean", name, "the row's term times the geometric mean of its weights",
             {"clip_ratio": 0.4}, inputs, gmpo(old, lp, a, m, isw))
    w0 = w.copy()
    w0[0, 1] = 0.0
    inputs = {"old_log_prob": old, "log_prob": lp, "advantages": a, "response_mask": m,
              "rollout_is_weights": w0}
    case("policy_loss_geo_mean", "is_weight_zero", "log(0 + 1e-10) drags the row to about 0",
         {"clip_ratio": 0.4}, inputs, gmpo(old, lp, a, m, w0))


def gdpo_cases():
    m = ragged_mask(6, 4, [4, 3, 2, 4, 1, 3])
    index = ["a", "a", "a", "b", "b", "c"]
    t1 = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])  # accuracy
    t2 = np.array([0.2, 0.9, 0.5, 0.1, 0.1, 0.3])  # format; group b has zero std
    case("gdpo", "two_terms", "group c has one member; term 2 has zero std in group b", {},
         {"response_mask": m, "index": index, "reward_terms": [t1, t2]},
         {"advantages": gdpo([t1, t2], m, index)})
    case("gdpo", "weights", "gdpo_reward_weights", {"weights": [1.0, 0.25]},
         {"response_mask": m, "index": index, "reward_terms": [t1, t2]},
         {"advantages": gdpo([t1, t2], m, index, [1.0, 0.25])})
    case("gdpo", "no_std", "norm_adv_by_std_in_grpo = False", {"norm_adv_by_std": False},
         {"response_mask": m, "index": index, "reward_terms": [t1, 10 * t2]},
         {"advantages": gdpo([t1, 10 * t2], m, index, by_std=False)})
    r = np.zeros((6, 4))
    for b, n in enumerate(m.sum(1).astype(int)):
        r[b, n - 1] = t1[b] + t2[b]
    case("gdpo", "one_term_from_token_rewards", "no reward_terms: GRPO of the sums, then whitened",
         {}, {"token_level_rewards": r, "response_mask": m, "index": index},
         {"advantages": gdpo([r.sum(1)], m, index)})
    m2 = m.copy()
    m2[3] = 0
    case("gdpo", "empty_row", "a row without tokens still counts in its group's statistics", {},
         {"response_mask": m2, "index": index, "reward_terms": [t1, t2]},
         {"advantages": gdpo([t1, t2], m2, index)})
    error_case("gdpo", "single_valid_token", "whitening needs 2 tokens", {},
               {"response_mask": [[1.0, 0.0], [0.0, 0.0]], "index": [1, 1],
                "reward_terms": [[1.0, 0.0]]}, "whitening needs at least 2")
    error_case("gdpo", "nonfinite_term", "refused", {},
               {"response_mask": [[1.0, 1.0], [1.0, 0.0]], "index": [1, 1],
                "reward_terms": [[1.0, float("nan")]]}, "finite")


def otb_cases():
    rows, cols = 5, 6
    m = ragged_mask(rows, cols, [6, 4, 2, 5, 0])
    r = np.zeros((rows, cols))
    for b, n in enumerate(m.sum(1).astype(int)):
        if n:
            r[b, n - 1] = [1.0, 0.0, 1.0, 0.5, 0.0][b]
    r[0, 2] = 0.25  # a dense reward inside a row
    old = rnd((rows, cols), -2.0, -0.05)
    spq = rnd((rows, cols), 0.05, 0.9)
    index = ["p", "p", "p", "q", "q"]
    isw = rnd((rows, cols), 0.5, 1.5)
    base = {"token_level_rewards": r, "response_mask": m, "index": index, "old_log_probs": old,
            "sum_pi_squared": spq}
    for name, params, extra, kw in (
            ("group_and_pair", {}, {}, {}),
            ("no_zero_tail", {"handle_zero_tail": False}, {}, {"zero_tail": False}),
            ("is_weights", {}, {"rollout_is_weights": isw}, {"isw": isw})):
        adv, ret = otb(r, m, index, old, spq, **kw)
        case("optimal_token_baseline", name,
             "group p: row 0 alone past step 4 (zero tail); group q holds an empty row", params,
             dict(base, **extra), {"advantages": adv, "returns": ret})
    single = ["x", "y", "y", "z", "z"]
    adv, ret = otb(r, m, single, old, spq)
    case("optimal_token_baseline", "singleton_group", "a group of one: advantage = return", {},
         dict(base, index=single), {"advantages": adv, "returns": ret})
    tie = ragged_mask(rows, cols, [6, 6, 2, 5, 0])
    adv, ret = otb(r, tie, index, old, spq)
    case("optimal_token_baseline", "tie_at_longest", "two rows share the longest length: no tail",
         {}, dict(base, response_mask=tie), {"advantages": adv, "returns": ret})
    # multi-turn masks: observations inside rows
    mt = np.array([[1, 1, 0, 0, 1, 1], [1, 0, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0],
                   [0, 0, 0, 0, 0, 0], [1, 0, 0, 1, 0, 0]], float)
    rt = np.zeros((rows, cols))
    rt[0, 5], rt[1, 4], rt[2, 2], rt[4, 3], rt[1, 1] = 1.0, 0.5, -0.5, 1.0, 3.0  # [1,1] masked
    base = {"token_level_rewards": rt, "response_mask": mt, "index": index, "old_log_probs": old,
            "sum_pi_squared": spq}
    for name, params, kw in (("multi_turn", {}, {}),
                             ("multi_turn_no_zero_tail", {"handle_zero_tail": False},
                              {"zero_tail": False})):
        for method, multi in (("tir_optimal_token_baseline", True),
                              ("optimal_token_baseline", False)):
            adv, ret = otb(rt, mt, index, old, spq, multi_turn=multi, **kw)
            case(method, name, "steps are sampled tokens (tir) or columns; an empty row in q",
                 params, base, {"advantages": adv, "returns": ret})
    error_case("optimal_token_baseline", "nonfinite_logprob", "refused", {},
               dict(base, old_log_probs=np.where(mt != 0, float("nan"), 0.0)), "finite")


def loss_cases():
    rows, cols = 4, 6
    old = rnd((rows, cols), -2.5, -0.1)
    lp = np.minimum(old + rnd((rows, cols), -0.5, 0.5), -0.01)  # log-probabilities stay < 0
    a = np.repeat(np.array([[1.3], [-0.8], [0.6], [-1.4]]), cols, 1)
    m = ragged_mask(rows, cols, [6, 4, 0, 5])
    isw = rnd((rows, cols), 0.5, 1.8)
    base = {"old_log_prob": old, "log_prob": lp, "advantages": a, "response_mask": m}

    def add(method, kind, name, note, params, kw, extra=None):
        inputs = dict(base, **(extra or {}))
        o = pg(kind, old, lp, a, m, isw=inputs.get("rollout_is_weights"), **kw)
        case(method, name, note, params, inputs, o)

    for kind in ("dppo_tv", "dppo_kl"):
        meth = "policy_loss_" + kind
        add(meth, kind, "defaults", "clip_ratio 0.2 as divergence bounds, ratio truncated at 3",
            {}, {})
        add(meth, kind, "recipe", "verl's DPPO recipe: bounds 0.15 (tv) / 0.05 (kl), c = 10000, "
            "seq-mean-token-sum-norm", {"clip_ratio": 0.15 if kind == "dppo_tv" else 0.05,
                                        "clip_ratio_c": 10000.0,
                                        "loss_agg_mode": "seq-mean-token-sum-norm"},
            {"lo": 0.15 if kind == "dppo_tv" else 0.05, "hi": 0.15 if kind == "dppo_tv" else 0.05,
             "c": 10000.0, "mode": "seq-mean-token-sum-norm"})
        add(meth, kind, "tight_asymmetric", "some tokens outside the trust region",
            {"clip_ratio_low": 0.02, "clip_ratio_high": 0.05}, {"lo": 0.02, "hi": 0.05})
        add(meth, kind, "truncated_ratio_is_weights", "clip_ratio_c 1.1 bites; IS weights",
            {"clip_ratio_c": 1.1, "loss_agg_mode": "seq-mean-token-mean"},
            {"c": 1.1, "mode": "seq-mean-token-mean"}, {"rollout_is_weights": isw})
    add("policy_loss_clip_cov", "clip_cov", "every_candidate",
        "clip_cov_ratio 0.5: all the candidates are chosen (no random choice)",
        {"clip_cov_ratio": 0.5, "clip_cov_lb": -0.5, "clip_cov_ub": 0.5},
        {"clip_cov": (0.5, -0.5, 0.5)})
    add("policy_loss_clip_cov", "clip_cov", "no_candidate", "the window (50, 60) holds no token",
        {"clip_cov_lb": 50, "clip_cov_ub": 60}, {"clip_cov": (2e-4, 50.0, 60.0)})
    add("policy_loss_clip_cov", "clip_cov", "is_weights_token_sum", "", {
        "clip_cov_ratio": 0.9, "clip_cov_lb": 0.0, "clip_cov_ub": 1.0,
        "loss_agg_mode": "token-sum"}, {"clip_cov": (0.9, 0.0, 1.0), "mode": "token-sum"},
        {"rollout_is_weights": isw})
    add("policy_loss_kl_cov", "kl_cov", "top_share", "kl_cov_ratio 0.2 of 15 tokens: 3 get the KL",
        {"kl_cov_ratio": 0.2, "ppo_kl_coef": 0.5}, {"kl_cov": (0.2, 0.5)})
    add("policy_loss_kl_cov", "kl_cov", "defaults", "at least one token; ppo_kl_coef 0.1", {},
        {"kl_cov": (2e-4, 0.1)})
    for name, params, kw, extra in (
            ("beta", {"dro_beta": 0.5}, {"beta": 0.5}, None),
            ("is_weights_seq_mean", {"dro_beta": 2.0, "loss_agg_mode": "seq-mean-token-sum"},
             {"beta": 2.0, "mode": "seq-mean-token-sum"}, {"rollout_is_weights": isw})):
        inputs = dict(base, **(extra or {}))
        o = pg("dro", old, lp, a, m, isw=inputs.get("rollout_is_weights"), **kw)
        case("policy_loss_dro", name, "-A logp + beta / 2 (logp - old)^2", params, inputs,
             {k: v for k, v in o.items() if k != "ppo_kl"})
    error_case("policy_loss_dro", "no_beta", "dro_beta is required", {}, base, "dro_beta")
    add("policy_loss_reinforce", "reinforce", "default_agg", "seq-mean-token-sum by default", {},
        {"mode": "seq-mean-token-sum"})
    add("policy_loss_reinforce", "reinforce", "is_weights_token_mean", "",
        {"loss_agg_mode": "token-mean"}, {"mode": "token-mean"}, {"rollout_is_weights": isw})
    error_case("policy_loss_dppo_tv", "nonfinite_logprob", "refused", {},
               dict(base, log_prob=np.where(m != 0, float("inf"), 0.0)), "finite")


def rollout_cases():
    rows, cols = 4, 5
    rollout = rnd((rows, cols), -3.0, -0.1)
    train = np.minimum(rollout + rnd((rows, cols), -0.9, 0.9), -0.01)
    m = ragged_mask(rows, cols, [5, 3, 4, 0])
    base = {"old_log_prob": train, "rollout_log_prob": rollout, "response_mask": m}
    specs = [
        ("token_tis", {"rollout_is": "token", "rollout_is_threshold": 1.5}),
        ("token_icepop", {"rollout_is": "token", "rollout_is_threshold": "0.6_1.6"}),
        ("sequence_tis", {"rollout_is": "sequence", "rollout_is_threshold": 2.0}),
        ("token_batch_normalize", {"rollout_is": "token", "rollout_is_threshold": 1.8,
                                   "rollout_is_batch_normalize": True}),
        ("sequence_batch_normalize", {"rollout_is": "sequence", "rollout_is_threshold": 5.0,
                                      "rollout_is_batch_normalize": True}),
        ("rs_token_k1_band", {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.6_1.8"}),
        ("rs_token_k1_default_lower", {"rollout_rs": "token_k1", "rollout_rs_threshold": 1.7}),
        ("rs_token_k2_k3", {"rollout_rs": "token_k2,token_k3", "rollout_rs_threshold": "0.2,0.25"}),
        ("rs_seq_sum_k1", {"rollout_rs": "seq_sum_k1", "rollout_rs_threshold": "0.4_3"}),
        ("rs_seq_mean_k3_seq_max_k2", {"rollout_rs": "seq_mean_k3,seq_max_k2",
                                       "rollout_rs_threshold": "0.1,0.3"}),
        ("rs_seq_sum_k2_seq_mean_k1", {"rollout_rs": "seq_sum_k2,seq_mean_k1",
                                       "rollout_rs_threshold": "0.6,0.8_1.25"}),
        ("rs_seq_max_k3", {"rollout_rs": "seq_max_k3", "rollout_rs_threshold": 0.3}),
        ("rs_binary_kl", {"rollout_rs": "binary_kl", "rollout_rs_threshold": 0.02}),
        ("is_and_rs", {"rollout_is": "token", "rollout_is_threshold": 2.0,
                       "rollout_rs": "seq_mean_k2", "rollout_rs_threshold": 0.1}),
    ]
    for name, params in specs:
        o = rollout_corr(train, rollout, m, params.get("rollout_is"),
                         params.get("rollout_is_threshold", 2.0),
                         params.get("rollout_is_batch_normalize", False),
                         params.get("rollout_rs"), params.get("rollout_rs_threshold"))
        case("rollout_correction", name, "an empty last row", params, base, o)
    error_case("rollout_correction", "empty_mask", "verl refuses a mask without tokens",
               {"rollout_is": "token"}, dict(base, response_mask=np.zeros((rows, cols))), "mask")
    # bypass mode: old_log_prob is the rollout's; weights and rejection from the current policy
    a = np.repeat(np.array([[0.9], [-1.1], [0.5], [1.0]]), cols, 1)
    inputs = {"old_log_prob": rollout, "log_prob": train, "advantages": a, "response_mask": m}
    for name, params in (
            ("ppo_clip_rs", {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2"}),
            ("reinforce_token_is", {"loss_type": "reinforce", "rollout_is": "token",
                                    "rollout_is_threshold": 1.4}),
            ("reinforce_sequence_is_rs", {"loss_type": "reinforce", "rollout_is": "sequence",
                                          "rollout_is_threshold": 3.0,
                                          "rollout_rs": "seq_max_k2",
                                          "rollout_rs_threshold": 0.3,
                                          "loss_agg_mode": "seq-mean-token-mean"})):
        rc = rollout_corr(train, rollout, m, params.get("rollout_is"),
                          params.get("rollout_is_threshold", 2.0), False,
                          params.get("rollout_rs"), params.get("rollout_rs_threshold"))
        mk = rc["modified_response_mask"]
        mode = params.get("loss_agg_mode", "token-mean")
        if params.get("loss_type") == "reinforce":
            o = pg("reinforce", rollout, train, a, mk, isw=rc.get("rollout_is_weights"),
                   mode=mode, scale=cols)
            out = {"loss": o["loss"], "ppo_kl": o["ppo_kl"]}
        else:
            o = pg("vanilla", rollout, train, a, mk, mode=mode, scale=cols)
            out = {"loss": o["loss"], "ppo_kl": o["ppo_kl"], "pg_clipfrac": o["pg_clipfrac"]}
        out["grad_wrt_logp"] = o["_agg_grad"]
        out["modified_response_mask"] = mk
        if "rollout_is_weights" in rc:
            out["rollout_is_weights"] = rc["rollout_is_weights"]
        case("policy_loss_bypass_mode", name, "old_log_prob = the rollout's", params, inputs, out)


def main():
    changed_rules()
    gdpo_cases()
    otb_cases()
    loss_cases()
    rollout_cases()
    here = os.path.dirname(os.path.abspath(__file__))
    doc = {"meta": {"generator": "gen_verl_vectors.py", "numpy": np.__version__,
                    "dtype": "float64", "verl": "1dda039",
                    "tolerance": {"rtol": 1e-5, "atol": 1e-6},
                    "encoding": "non-finite floats are the strings 'nan', 'inf', '-inf'",
                    "n_cases": len(CASES)},
           "cases": CASES}
    with open(os.path.join(here, "verl_vectors.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(len(CASES), "cases")


if __name__ == "__main__":
    main()
