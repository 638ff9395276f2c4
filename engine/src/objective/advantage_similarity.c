/* advantage_similarity.c - similarity of texts and action sequences for grouping and gating:
 * difflib's Ratcliff-Obershelp ratio (GiGPO similarity step groups, BEACON milestone matching),
 * normalised Levenshtein distance, and the selective rollout gate's divergence metrics. */
#include "advantage.h"
#include "utf8.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- difflib's SequenceMatcher ratio ---- */

/* Code points of UTF-8 text; a maximal invalid subpart becomes one symbol, 0x110000 + its first
 * byte, which no code point equals. Returns the count (<= len). */
static int64_t decode_utf8(const unsigned char *s, size_t len, int32_t *out) {
  int64_t n = 0;
  for (size_t i = 0; i < len;) {
    uint32_t cp;
    size_t step = mrl__utf8_decode(s + i, len - i, &cp);
    out[n++] = (int32_t)(cp == MRL_UTF8_INVALID ? 0x110000u + s[i] : cp);
    i += step;
  }
  return n;
}

typedef struct {
  const int32_t *a, *b;
  const bool *popular; /* b's elements that difflib leaves out of its index (never junk) */
  int64_t *prev, *cur; /* lengths of matches ending at b[j - 1], rows i - 1 and i */
} matcher;

/* difflib's find_longest_match without junk: the longest a[i..i+k) == b[j..j+k) inside the ranges,
 * the earliest in a, then in b, among those of that length, found through non-popular elements and
 * then extended over popular ones. */
static int64_t longest_match(matcher *m, int64_t alo, int64_t ahi, int64_t blo, int64_t bhi,
                             int64_t *bi, int64_t *bj) {
  int64_t besti = alo, bestj = blo, size = 0;
  for (int64_t j = blo; j <= bhi; j++) m->prev[j] = 0;
  for (int64_t i = alo; i < ahi; i++) {
    m->cur[blo] = 0;
    for (int64_t j = blo; j < bhi; j++) {
      int64_t k = m->a[i] == m->b[j] && !m->popular[j] ? m->prev[j] + 1 : 0;
      m->cur[j + 1] = k;
      if (k > size) {
        besti = i - k + 1;
        bestj = j - k + 1;
        size = k;
      }
    }
    int64_t *t = m->prev;
    m->prev = m->cur;
    m->cur = t;
  }
  while (besti > alo && bestj > blo && m->a[besti - 1] == m->b[bestj - 1]) {
    besti--;
    bestj--;
    size++;
  }
  while (besti + size < ahi && bestj + size < bhi && m->a[besti + size] == m->b[bestj + size])
    size++;
  *bi = besti;
  *bj = bestj;
  return size;
}

typedef struct {
  int32_t value;
  int64_t pos;
} symbol_at;

static int compare_symbols(const void *x, const void *y) {
  const symbol_at *p = x, *q = y;
  if (p->value != q->value) return p->value < q->value ? -1 : 1;
  return p->pos < q->pos ? -1 : p->pos > q->pos;
}

static void push_range(int64_t *stack, int64_t *top, int64_t alo, int64_t ahi, int64_t blo,
                       int64_t bhi) {
  stack[(*top)++] = alo;
  stack[(*top)++] = ahi;
  stack[(*top)++] = blo;
  stack[(*top)++] = bhi;
}

/* difflib's ratio 2 M / (la + lb) of the decoded sequences, M the total size of the matching
 * blocks found by recursing on both sides of each longest match; s provides the scratch */
static mrl_status ratio_of(mrl__scratch *s, const int32_t *a, int64_t la, const int32_t *b,
                           int64_t lb, double *out) {
  if (la + lb == 0) {
    *out = 1.0;
    return MRL_OK;
  }
  int used = s->n;
  bool *popular = mrl__scratch_get(s, lb, sizeof *popular);
  int64_t *prev = mrl__scratch_get(s, lb + 1, sizeof *prev);
  int64_t *cur = mrl__scratch_get(s, lb + 1, sizeof *cur);
  int64_t *stack = mrl__scratch_get(s, 4 * (la + lb + 1), sizeof *stack);
  if (!popular || !prev || !cur || !stack) return MRL_ERR_NOMEM;
  if (lb >= 200) { /* difflib's autojunk: elements filling more than 1% of a long b */
    symbol_at *sym = mrl__scratch_get(s, lb, sizeof *sym);
    if (!sym) return MRL_ERR_NOMEM;
    for (int64_t j = 0; j < lb; j++) sym[j] = (symbol_at){b[j], j};
    qsort(sym, (size_t)lb, sizeof *sym, compare_symbols);
    for (int64_t j = 0, end; j < lb; j = end) {
      for (end = j; end < lb && sym[end].value == sym[j].value;) end++;
      if (end - j > lb / 100 + 1)
        for (int64_t q = j; q < end; q++) popular[sym[q].pos] = true;
    }
  }
  matcher m = {a, b, popular, prev, cur};
  int64_t top = 0, matched = 0;
  push_range(stack, &top, 0, la, 0, lb);
  while (top > 0) { /* every match found adds at most one pending range: la + lb + 1 suffice */
    top -= 4;
    int64_t alo = stack[top], ahi = stack[top + 1], blo = stack[top + 2], bhi = stack[top + 3];
    int64_t i, j, k = longest_match(&m, alo, ahi, blo, bhi, &i, &j);
    if (k == 0) continue;
    matched += k;
    if (alo < i && blo < j) push_range(stack, &top, alo, i, blo, j);
    if (i + k < ahi && j + k < bhi) push_range(stack, &top, i + k, ahi, j + k, bhi);
  }
  *out = 2.0 * (double)matched / (double)(la + lb);
  while (s->n > used) { /* give this call's blocks back: callers compare many pairs */
    s->n--;
    mrl__free(s->e, s->block[s->n], s->size[s->n]);
  }
  return MRL_OK;
}

static mrl_status text_ratio(mrl__scratch *s, const char *a, size_t la, const char *b, size_t lb,
                             double *out) {
  int used = s->n;
  int32_t *da = mrl__scratch_get(s, (int64_t)la, sizeof *da);
  int32_t *db = mrl__scratch_get(s, (int64_t)lb, sizeof *db);
  if (!da || !db) return MRL_ERR_NOMEM;
  int64_t na = decode_utf8((const unsigned char *)a, la, da);
  int64_t nb = decode_utf8((const unsigned char *)b, lb, db);
  mrl_status st = ratio_of(s, da, na, db, nb, out);
  while (s->n > used) {
    s->n--;
    mrl__free(s->e, s->block[s->n], s->size[s->n]);
  }
  return st;
}

mrl_status mrl_text_similarity(mrl_engine *e, const char *a, size_t a_len, const char *b,
                               size_t b_len, double *ratio) {
  static const char fn[] = "mrl_text_similarity";
  if (!e) return MRL_ERR_NULL;
  ADV_TRY(mrl__adv_need(e, fn, "a", a, (int64_t)a_len));
  ADV_TRY(mrl__adv_need(e, fn, "b", b, (int64_t)b_len));
  ADV_TRY(mrl__adv_need(e, fn, "ratio", ratio, 1));
  mrl__scratch s = {.e = e, .fn = fn};
  mrl_status st = text_ratio(&s, a, a_len, b, b_len, ratio);
  mrl__scratch_free(&s);
  return st;
}

/* texts[i] and its length (lens NULL: NUL-terminated) */
static mrl_status text_at(mrl_engine *e, const char *fn, const char *name, const char *const *texts,
                          const size_t *lens, int64_t i, const char **p, size_t *len) {
  *p = texts[i];
  if (!*p && (!lens || lens[i] > 0))
    return mrl__fail(e, MRL_ERR_NULL, fn, "%s[%lld] is NULL", name, (long long)i);
  *len = lens ? lens[i] : strlen(*p);
  return MRL_OK;
}

static mrl_status check_texts(mrl_engine *e, const char *fn, const char *name,
                              const char *const *texts, const size_t *lens, int64_t n) {
  ADV_TRY(mrl__adv_sizes(e, fn, n, 1));
  ADV_TRY(mrl__adv_need(e, fn, name, texts, n));
  for (int64_t i = 0; i < n; i++) {
    const char *p;
    size_t len;
    ADV_TRY(text_at(e, fn, name, texts, lens, i, &p, &len));
  }
  return MRL_OK;
}

mrl_status mrl_similarity_groups(mrl_engine *e, const char *const *texts, const size_t *lens,
                                 const int64_t *group, int64_t n, double threshold, int64_t *out) {
  static const char fn[] = "mrl_similarity_groups";
  if (!e) return MRL_ERR_NULL;
  ADV_TRY(check_texts(e, fn, "texts", texts, lens, n));
  ADV_TRY(mrl__adv_need(e, fn, "group", group, n));
  ADV_TRY(mrl__adv_need(e, fn, "out", out, n));
  if (!(threshold > 0.0 && threshold < 1.0))
    return mrl__fail(e, MRL_ERR_INVALID, fn, "threshold is %g; it must be in (0, 1)", threshold);
  mrl__scratch s = {.e = e, .fn = fn};
  mrl_status st = MRL_ERR_NOMEM;
  int64_t *g = mrl__scratch_get(&s, n, sizeof *g), groups = 0;
  int64_t *rep = mrl__scratch_get(&s, n, sizeof *rep); /* first row of each cluster */
  int64_t *id = mrl__scratch_get(&s, n, sizeof *id);
  if (!g || !rep || !id || mrl__dense_ids(&s, group, NULL, n, g, &groups)) goto done;
  int64_t clusters = 0;
  for (int64_t i = 0; i < n; i++) {
    const char *p, *q;
    size_t lp, lq;
    text_at(e, fn, "texts", texts, lens, i, &p, &lp);
    id[i] = -1;
    for (int64_t c = 0; c < clusters && id[i] < 0; c++) {
      if (g[rep[c]] != g[i]) continue;
      double r;
      text_at(e, fn, "texts", texts, lens, rep[c], &q, &lq);
      if ((st = text_ratio(&s, p, lp, q, lq, &r))) goto done;
      if (r >= threshold) id[i] = c;
    }
    if (id[i] < 0) {
      rep[clusters] = i;
      id[i] = clusters++;
    }
  }
  for (int64_t i = 0; i < n; i++) out[i] = id[i];
  st = MRL_OK;
done:
  mrl__scratch_free(&s);
  return st;
}

mrl_status mrl_match_milestones(mrl_engine *e, const char *const *actions,
                                const size_t *action_lens, int64_t n_actions,
                                const char *const *milestones, const size_t *milestone_lens,
                                int64_t n_milestones, double threshold, int64_t *match) {
  static const char fn[] = "mrl_match_milestones";
  if (!e) return MRL_ERR_NULL;
  ADV_TRY(check_texts(e, fn, "actions", actions, action_lens, n_actions));
  ADV_TRY(check_texts(e, fn, "milestones", milestones, milestone_lens, n_milestones));
  ADV_TRY(mrl__adv_need(e, fn, "match", match, n_milestones));
  ADV_TRY(mrl__adv_range(e, fn, "threshold", threshold, 0.0, 1.0));
  mrl__scratch s = {.e = e, .fn = fn};
  mrl_status st = MRL_ERR_NOMEM;
  int64_t *found = mrl__scratch_get(&s, n_milestones, sizeof *found);
  if (!found) goto done;
  int64_t k = 0;
  for (int64_t t = 0; t < n_actions && k < n_milestones; t++) {
    const char *p, *q;
    size_t lp, lq;
    double r;
    text_at(e, fn, "actions", actions, action_lens, t, &p, &lp);
    text_at(e, fn, "milestones", milestones, milestone_lens, k, &q, &lq);
    if ((st = text_ratio(&s, p, lp, q, lq, &r))) goto done;
    if (r >= threshold) found[k++] = t;
  }
  for (int64_t j = 0; j < n_milestones; j++) match[j] = j < k ? found[j] : -1;
  st = MRL_OK;
done:
  mrl__scratch_free(&s);
  return st;
}

/* ---- edit distance and the selective rollout gate ---- */

/* Levenshtein distance / max length, with one row of scratch (lb + 1 entries) */
static double normalized_distance(const int64_t *a, int64_t la, const int64_t *b, int64_t lb,
                                  int64_t *row) {
  if (la == 0 && lb == 0) return 0.0;
  for (int64_t j = 0; j <= lb; j++) row[j] = j;
  for (int64_t i = 1; i <= la; i++) {
    int64_t diag = row[0];
    row[0] = i;
    for (int64_t j = 1; j <= lb; j++) {
      int64_t up = row[j];
      int64_t best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return (double)row[lb] / (double)(la > lb ? la : lb);
}

mrl_status mrl_edit_distance(mrl_engine *e, const int64_t *a, int64_t a_len, const int64_t *b,
                             int64_t b_len, double *out) {
  static const char fn[] = "mrl_edit_distance";
  ADV_TRY(mrl__adv_sizes(e, fn, a_len, 1));
  ADV_TRY(mrl__adv_sizes(e, fn, b_len, 1));
  ADV_TRY(mrl__adv_need(e, fn, "a", a, a_len));
  ADV_TRY(mrl__adv_need(e, fn, "b", b, b_len));
  ADV_TRY(mrl__adv_need(e, fn, "out", out, 1));
  mrl__scratch s = {.e = e, .fn = fn};
  int64_t *row = mrl__scratch_get(&s, b_len + 1, sizeof *row);
  if (!row) return MRL_ERR_NOMEM;
  *out = normalized_distance(a, a_len, b, b_len, row);
  mrl__scratch_free(&s);
  return MRL_OK;
}

typedef struct {
  int64_t first, second;
} bigram;

static int compare_bigrams(const void *x, const void *y) {
  const bigram *p = x, *q = y;
  if (p->first != q->first) return p->first < q->first ? -1 : 1;
  return p->second < q->second ? -1 : p->second > q->second;
}

/* Jaccard distance of two sorted bigram sets */
static double jaccard_distance(const bigram *a, int64_t na, const bigram *b, int64_t nb) {
  if (na == 0 && nb == 0) return 0.0;
  int64_t i = 0, j = 0, both = 0;
  while (i < na && j < nb) {
    int c = compare_bigrams(&a[i], &b[j]);
    both += c == 0;
    i += c <= 0;
    j += c >= 0;
  }
  return 1.0 - (double)both / (double)(na + nb - both);
}

mrl_status mrl_selective_gate_eval(mrl_engine *e, const int64_t *actions, const int64_t *offsets,
                                   int64_t trajs, int64_t K, double d_low, double t_high,
                                   mrl_selective_gate *out) {
  static const char fn[] = "mrl_selective_gate_eval";
  ADV_TRY(mrl__adv_sizes(e, fn, trajs, 1));
  ADV_TRY(mrl__adv_need(e, fn, "offsets", offsets, trajs + 1));
  ADV_TRY(mrl__adv_need(e, fn, "out", out, 1));
  if (trajs < 2)
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "divergence needs a group of 2 or more trajectories (got %lld)",
                     (long long)trajs);
  if (K < 1 || K > INT32_MAX)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "K is %lld; it must be >= 1", (long long)K);
  ADV_TRY(mrl__adv_range(e, fn, "d_low", d_low, -INFINITY, INFINITY));
  ADV_TRY(mrl__adv_range(e, fn, "t_high", t_high, -INFINITY, INFINITY));
  if (offsets[0] != 0)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "offsets[0] is %lld; it must be 0",
                     (long long)offsets[0]);
  for (int64_t i = 0; i < trajs; i++)
    if (offsets[i + 1] < offsets[i])
      return mrl__fail(e, MRL_ERR_INVALID, fn, "offsets decrease at %lld", (long long)i + 1);
  int64_t total = offsets[trajs];
  ADV_TRY(mrl__adv_need(e, fn, "actions", actions, total));
  ADV_TRY(mrl__adv_sizes(e, fn, trajs, K));

  mrl__scratch s = {.e = e, .fn = fn};
  mrl_status st = MRL_ERR_NOMEM;
  int64_t *sym = mrl__scratch_get(&s, total, sizeof *sym), distinct = 0;
  int64_t *prefix = mrl__scratch_get(&s, trajs * K, sizeof *prefix);
  bigram *bg = mrl__scratch_get(&s, trajs * K, sizeof *bg);
  int64_t *nbg = mrl__scratch_get(&s, trajs, sizeof *nbg);
  int64_t *row = mrl__scratch_get(&s, K + 1, sizeof *row);
  int64_t *count = mrl__scratch_get(&s, total + 1, sizeof *count);
  if (!sym || !prefix || !bg || !nbg || !row || !count ||
      mrl__dense_ids(&s, actions, NULL, total, sym, &distinct))
    goto done;
  int64_t ended = 0;
  for (int64_t i = 0; i < trajs; i++) {
    int64_t len = offsets[i + 1] - offsets[i];
    ended += len <= K - 1;
    int64_t *p = prefix + i * K;
    for (int64_t t = 0; t < K; t++) p[t] = t < len ? sym[offsets[i] + t] : -1; /* -1: <END> */
    bigram *set = bg + i * K;
    for (int64_t t = 0; t + 1 < K; t++) set[t] = (bigram){p[t], p[t + 1]};
    qsort(set, (size_t)(K - 1), sizeof *set, compare_bigrams);
    int64_t m = 0;
    for (int64_t t = 0; t + 1 < K; t++)
      if (m == 0 || compare_bigrams(&set[m - 1], &set[t]) != 0) set[m++] = set[t];
    nbg[i] = m;
  }
  double dist = 0.0, jac = 0.0, pairs = (double)trajs * (double)(trajs - 1) / 2.0;
  int64_t unique_prefixes = 0;
  for (int64_t i = 0; i < trajs; i++) {
    bool repeated = false;
    for (int64_t j = 0; j < i && !repeated; j++)
      repeated = memcmp(prefix + i * K, prefix + j * K, (size_t)K * sizeof *prefix) == 0;
    unique_prefixes += !repeated;
    for (int64_t j = i + 1; j < trajs; j++) {
      dist += normalized_distance(prefix + i * K, K, prefix + j * K, K, row);
      jac += jaccard_distance(bg + i * K, nbg[i], bg + j * K, nbg[j]);
    }
  }
  /* the actions at position K - 1 (the end symbol -1 counts in slot `distinct`) */
  for (int64_t i = 0; i < trajs; i++) {
    int64_t a = prefix[i * K + K - 1];
    count[a < 0 ? distinct : a]++;
  }
  int64_t unique_actions = 0;
  double entropy = 0.0;
  for (int64_t v = 0; v <= distinct; v++)
    if (count[v] > 0) {
      double p = (double)count[v] / (double)trajs;
      unique_actions++;
      entropy -= p * log2(p);
    }
  out->edit_distance = dist / pairs;
  out->termination = (double)ended / (double)trajs;
  out->unique_action = (double)unique_actions / (double)trajs;
  out->unique_prefix = (double)unique_prefixes / (double)trajs;
  out->bigram_jaccard = jac / pairs;
  out->action_entropy = entropy / log2((double)trajs);
  out->cut = out->edit_distance < d_low || out->termination >= t_high;
  st = MRL_OK;
done:
  mrl__scratch_free(&s);
  return st;
}
