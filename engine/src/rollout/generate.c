/* generate.c - mrl_model_generate: continuations of a batch of prompts sampled together over a KV
 * cache, each sequence with its own stream (seed + b), stopping on stop ids, on stop strings
 * matched in the decoded text across token boundaries, on a token limit or a full context. */
#include "internal.h"

#include <string.h>

/* What one call holds: the cache (when it made one), per-sequence scratch, the stop-string tails
 * (the last longest - 1 bytes of each sequence's text) and a window to match in. */
typedef struct {
  mrl_engine *e;
  mrl_kv_cache *own_cache;
  int batch, max_new;
  int *slots;      /* batch: the live sequences */
  int *ones;       /* batch: 1s, the counts of a one-token append */
  int32_t *next;   /* batch: the tokens just sampled */
  float *next_lp;  /* batch */
  int32_t *tokens; /* batch * max_new: the outputs, copied out on success */
  float *logprobs;
  int *lengths, *reasons;
  char *tails;     /* batch * longest */
  size_t *tail_used;
  char *window;    /* longest - 1 + the bytes of one token */
  size_t window_cap;
  size_t longest;
} gen_state;

static void gen_free(gen_state *g) {
  mrl_engine *e = g->e;
  size_t b = (size_t)g->batch, total = b * (size_t)g->max_new;
  mrl_kv_cache_free(g->own_cache);
  mrl__free(e, g->slots, sizeof(int) * b);
  mrl__free(e, g->ones, sizeof(int) * b);
  mrl__free(e, g->next, sizeof(int32_t) * b);
  mrl__free(e, g->next_lp, sizeof(float) * b);
  mrl__free(e, g->tokens, sizeof(int32_t) * total);
  mrl__free(e, g->logprobs, sizeof(float) * total);
  mrl__free(e, g->lengths, sizeof(int) * b);
  mrl__free(e, g->reasons, sizeof(int) * b);
  mrl__free(e, g->tails, b * g->longest);
  mrl__free(e, g->tail_used, sizeof(size_t) * b);
  mrl__free(e, g->window, g->window_cap);
}

static mrl_status check_args(mrl_engine *e, const char *fn, const mrl_model_config *mc, int batch,
                             const int32_t *prompts, const int *prompt_lengths,
                             const mrl_generate_options *o, const int32_t *tokens,
                             const int *lengths, const int *reasons) {
  if (!prompts || !prompt_lengths || !o || !tokens || !lengths || !reasons)
    return mrl__fail(e, MRL_ERR_NULL, fn, "%s is NULL",
                     !prompts ? "prompts" : !prompt_lengths ? "prompt_lengths" : !o ? "opts"
                     : !tokens ? "tokens" : !lengths ? "lengths" : "reasons");
  if (batch <= 0) return mrl__fail(e, MRL_ERR_INVALID, fn, "batch is %d, expected 1 or more", batch);
  if (o->max_new_tokens <= 0)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "max_new_tokens is %d, expected 1 or more",
                     o->max_new_tokens);
  for (int b = 0; b < batch; b++)
    if (prompt_lengths[b] < 1 || prompt_lengths[b] > mc->ctx)
      return mrl__fail(e, MRL_ERR_RANGE, fn, "prompt %d has %d tokens, expected 1..%d (the context)",
                       b, prompt_lengths[b], mc->ctx);
  if (o->n_stop < 0 || (o->n_stop > 0 && !o->stop))
    return mrl__fail(e, o->n_stop < 0 ? MRL_ERR_INVALID : MRL_ERR_NULL, fn,
                     "n_stop is %d with stop %s", o->n_stop, o->stop ? "given" : "NULL");
  for (int i = 0; i < o->n_stop; i++)
    if (o->stop[i] < 0 || o->stop[i] >= mc->vocab)
      return mrl__fail(e, MRL_ERR_RANGE, fn, "stop[%d] is %d, outside 0..%d", i, (int)o->stop[i],
                       mc->vocab - 1);
  if (o->n_stop_strings < 0)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "n_stop_strings is negative");
  if (o->n_stop_strings > 0 && (!o->stop_strings || !o->stop_lengths || !o->tokenizer))
    return mrl__fail(e, MRL_ERR_NULL, fn, "stop strings need %s",
                     !o->tokenizer ? "the tokenizer to decode with"
                                   : "stop_strings and stop_lengths");
  for (int i = 0; i < o->n_stop_strings; i++)
    if (!o->stop_strings[i] || o->stop_lengths[i] == 0)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "stop_strings[%d] is %s", i,
                       o->stop_strings[i] ? "empty" : "NULL");
  return MRL_OK;
}

/* Adds the bytes of sequence b's new token to its text and reports whether a stop string now
 * ends in them. A token without text (a gap in a sparse vocabulary) adds nothing. */
static mrl_status hits_stop_string(gen_state *g, const mrl_generate_options *o, int b,
                                   int32_t token, bool *hit) {
  const char *fn = "mrl_model_generate";
  char *tail = g->tails + (size_t)b * g->longest;
  size_t used = g->tail_used[b], len = 0;
  char *dst = g->window_cap > used ? g->window + used : NULL;
  mrl_status st = mrl_tokenizer_decode(o->tokenizer, &token, 1, dst,
                                       dst ? g->window_cap - used : 0, &len);
  *hit = false;
  if (st == MRL_ERR_RANGE) return MRL_OK;
  if (st) return st;
  if (used + len + 1 > g->window_cap) {
    size_t cap = 2 * (used + len + 1);
    char *w = mrl__alloc(g->e, cap);
    if (!w) return mrl__fail(g->e, MRL_ERR_NOMEM, fn, "out of memory");
    mrl__free(g->e, g->window, g->window_cap);
    g->window = w;
    g->window_cap = cap;
    if ((st = mrl_tokenizer_decode(o->tokenizer, &token, 1, w + used, cap - used, &len))) return st;
  }
  memcpy(g->window, tail, used);
  size_t n = used + len;
  for (int i = 0; i < o->n_stop_strings && !*hit; i++) {
    size_t sl = o->stop_lengths[i];
    /* a match ending in the old bytes would have stopped the sequence already */
    size_t from = used + 1 > sl ? used + 1 - sl : 0;
    for (size_t at = from; at + sl <= n && !*hit; at++)
      *hit = memcmp(g->window + at, o->stop_strings[i], sl) == 0;
  }
  size_t keep = n < g->longest - 1 ? n : g->longest - 1;
  memcpy(tail, g->window + n - keep, keep);
  g->tail_used[b] = keep;
  return MRL_OK;
}

mrl_status mrl_model_generate(mrl_model *m, int batch, const int32_t *prompts,
                              const int *prompt_lengths, const mrl_generate_options *opts,
                              int32_t *tokens, float *logprobs, int *lengths, int *reasons) {
  const char *fn = "mrl_model_generate";
  if (!m) return MRL_ERR_NULL;
  mrl_engine *e = mrl_model_engine(m);
  mrl_model_config mc;
  mrl_model_config_get(m, &mc);
  mrl_status st = check_args(e, fn, &mc, batch, prompts, prompt_lengths, opts, tokens, lengths,
                             reasons);
  if (st) return st;
  const mrl_generate_options *o = opts;
  int max_new = o->max_new_tokens, longest = 0;
  for (int b = 0; b < batch; b++) longest = prompt_lengths[b] > longest ? prompt_lengths[b] : longest;
  /* the longest prompt plus every new token but the last (never appended), within the context */
  int64_t capacity = (int64_t)longest + max_new;
  if (capacity > mc.ctx) capacity = mc.ctx;
  gen_state g;
  memset(&g, 0, sizeof g);
  g.e = e;
  g.batch = batch;
  g.max_new = max_new;
  for (int i = 0; i < o->n_stop_strings; i++)
    if (o->stop_lengths[i] > g.longest) g.longest = o->stop_lengths[i];
  size_t nb = (size_t)batch, total = nb * (size_t)max_new;
  g.slots = mrl__alloc(e, sizeof(int) * nb);
  g.ones = mrl__alloc(e, sizeof(int) * nb);
  g.next = mrl__alloc(e, sizeof(int32_t) * nb);
  g.next_lp = mrl__alloc(e, sizeof(float) * nb);
  g.tokens = mrl__alloc(e, sizeof(int32_t) * total);
  g.logprobs = mrl__alloc(e, sizeof(float) * total);
  g.lengths = mrl__alloc(e, sizeof(int) * nb);
  g.reasons = mrl__alloc(e, sizeof(int) * nb);
  bool ok = g.slots && g.ones && g.next && g.next_lp && g.tokens && g.logprobs && g.lengths &&
            g.reasons;
  if (ok && g.longest > 0) {
    g.tails = mrl__alloc(e, nb * g.longest);
    g.tail_used = mrl__alloc(e, sizeof(size_t) * nb);
    g.window_cap = 2 * g.longest + 16;
    g.window = mrl__alloc(e, g.window_cap);
    ok = g.tails && g.tail_used && g.window;
    if (!g.window) g.window_cap = 0;
  }
  if (!ok) {
    st = mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory");
    goto done;
  }
  mrl_kv_cache *c = o->cache;
  if (!c && (st = mrl_kv_cache_new(m, batch, (int)capacity, &g.own_cache))) goto done;
  if (!c) c = g.own_cache;
  for (int b = 0; b < batch; b++) {
    if ((st = mrl_kv_cache_reset(c, b, o->seed + (uint64_t)b))) goto done;
    g.slots[b] = b;
    g.ones[b] = 1;
    g.lengths[b] = 0;
    if (g.tail_used) g.tail_used[b] = 0;
  }
  if ((st = mrl_kv_cache_append(c, batch, g.slots, prompts, prompt_lengths))) goto done;
  int live = batch;
  for (int step = 0; step < max_new && live > 0; step++) {
    if ((st = mrl_kv_cache_sample(c, live, g.slots, &o->sampling, g.next, g.next_lp))) goto done;
    int keep = 0;
    for (int i = 0; i < live; i++) {
      int b = g.slots[i];
      size_t at = (size_t)b * (size_t)max_new + (size_t)step;
      g.tokens[at] = g.next[i];
      g.logprobs[at] = g.next_lp[i];
      g.lengths[b] = step + 1;
      bool stopped = false;
      for (int k = 0; k < o->n_stop && !stopped; k++) stopped = g.next[i] == o->stop[k];
      if (!stopped && o->n_stop_strings > 0 &&
          (st = hits_stop_string(&g, o, b, g.next[i], &stopped)))
        goto done;
      bool full = mrl_kv_cache_length(c, b) >= capacity;
      if (stopped || full || step + 1 == max_new) {
        g.reasons[b] = stopped ? MRL_TURN_STOP : full ? MRL_TURN_FULL : MRL_TURN_LENGTH;
      } else {
        g.slots[keep] = b;
        g.next[keep] = g.next[i];
        keep++;
      }
    }
    live = keep;
    if (live > 0 && (st = mrl_kv_cache_append(c, live, g.slots, g.next, g.ones))) goto done;
  }
  for (size_t b = 0; b < nb; b++) {
    size_t row = b * (size_t)max_new, len = (size_t)g.lengths[b];
    memcpy(tokens + row, g.tokens + row, sizeof(int32_t) * len);
    if (logprobs) memcpy(logprobs + row, g.logprobs + row, sizeof(float) * len);
  }
  memcpy(lengths, g.lengths, sizeof(int) * nb);
  memcpy(reasons, g.reasons, sizeof(int) * nb);
done:
  gen_free(&g);
  return st;
}
