/* attention.c - causal attention of one head over one sequence, the pieces of work the decoder
 * block and its backward pass hand to the engine's threads: scores = q k^T / sqrt(hd) over the
 * causal range, softmax, out = p v; and the gradients of the same.
 *
 * The kernels are plain C, tiled so that gcc vectorizes them at -O2: a tile is ATT_ROWS query
 * rows by ATT_COLS columns of accumulators held in registers through the whole reduction. They
 * never call OpenBLAS (from a worker thread it would hand the product to OpenBLAS's own threads).
 * Every output element is a sum in one fixed order (the reduction index ascending), whatever the
 * tiling or the thread, so results do not depend on the thread count; and a row gives the same
 * numbers whether it comes alone (decoding) or with others (a prompt, the training pass). On
 * x86-64 the kernels are compiled for x86-64-v4 (AVX-512), v3 (AVX2) and the baseline, chosen at
 * load time; in the kernels the compiler may fuse a multiplication and the addition it feeds
 * into one FMA where the CPU has them (v3, v4, other architectures), which keeps each element's
 * order of operations: machines with and without FMA may differ in the last bits (as OpenBLAS's
 * results do), one machine never does. Beside them stays the reference they are tested against:
 * the same maths as matrix products through mrl__gemm (OpenBLAS, or the portable kernel), for
 * the calling thread only. */
#include "model.h"
#include "kernel_math.h"

#include <math.h>
#include <string.h>

enum { ATT_ROWS = 4, ATT_COLS = MRL_ATTN_COLS };

/* full unrolling of the tile loops, so that the accumulators become registers */
#define ATT_UNROLL_ROWS _Pragma("GCC unroll 4")
#define ATT_UNROLL_COLS _Pragma("GCC unroll 16")

static int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

/* Columns of the transposed keys (and of a tile's scores): room for a tile's last row (which may
 * look ATT_ROWS - 1 keys past the real ones) rounded to whole column tiles. */
static int64_t padded_keys(int keys) { return round_up((int64_t)keys + ATT_ROWS - 1, ATT_COLS); }

/* ---- the tiled kernels ---- */

/* s (ATT_ROWS, lds): s[r][c] = scale * sum_d a[r][d] bt[d][c] for c < cols (whole tiles), with a
 * the tile's query rows and bt the transposed keys: row d of column tile j at bt + d ldb + j ldc
 * (ldc = ATT_COLS when the rows are plain rows). */
MRL_KERNEL static void tile_scores(float *restrict s, int64_t lds, const float *const a[ATT_ROWS],
                                   const float *restrict bt, int64_t ldb, int64_t ldc, int hd,
                                   int64_t cols, float scale) {
  for (int64_t c0 = 0; c0 < cols; c0 += ATT_COLS) {
    float acc[ATT_ROWS][ATT_COLS] = {{0}};
    for (int d = 0; d < hd; d++) {
      const float *b = bt + (int64_t)d * ldb + c0 / ATT_COLS * ldc;
      ATT_UNROLL_ROWS
      for (int r = 0; r < ATT_ROWS; r++) {
        float x = a[r][d];
        ATT_UNROLL_COLS
        for (int u = 0; u < ATT_COLS; u++) acc[r][u] += x * b[u];
      }
    }
    for (int r = 0; r < ATT_ROWS; r++)
      for (int u = 0; u < ATT_COLS; u++) s[r * lds + c0 + u] = acc[r][u] * scale;
  }
}

/* o (ATT_ROWS, hp) = p v for the tile's first n rows: o[r][d] = sum_{k <= last + r} p[r][k]
 * v[k][d], v (keys, ldv) read in whole tiles of columns (hp, a multiple of ATT_COLS). Rows past n
 * get partial sums (the caller drops them) and v is not read past key last + n - 1. */
MRL_KERNEL static void tile_combine(float *restrict o, const float *const p[ATT_ROWS],
                                    const float *restrict v, int64_t ldv, int hp, int n,
                                    int last) {
  for (int d0 = 0; d0 < hp; d0 += ATT_COLS) {
    float acc[ATT_ROWS][ATT_COLS] = {{0}};
    for (int k = 0; k <= last; k++) {
      const float *vk = v + (int64_t)k * ldv + d0;
      ATT_UNROLL_ROWS
      for (int r = 0; r < ATT_ROWS; r++) {
        float x = p[r][k];
        ATT_UNROLL_COLS
        for (int u = 0; u < ATT_COLS; u++) acc[r][u] += x * vk[u];
      }
    }
    for (int k = last + 1; k < last + n; k++) { /* seen only by the tile's later rows */
      const float *vk = v + (int64_t)k * ldv + d0;
      for (int r = k - last; r < n; r++) {
        float x = p[r][k];
        ATT_UNROLL_COLS
        for (int u = 0; u < ATT_COLS; u++) acc[r][u] += x * vk[u];
      }
    }
    for (int r = 0; r < ATT_ROWS; r++)
      for (int u = 0; u < ATT_COLS; u++) o[r * hp + d0 + u] = acc[r][u];
  }
}

/* The same two for one row (decoding appends one token at a time), ATT_ROWS column tiles at a
 * time so that four sums are in flight rather than one long chain. Each element is summed in the
 * same order as in a tile, so a row gives the same bits either way. (The tiles that are left
 * are a plain loop for the loop vectorizer; a lone unrolled tile would be left scalar.) */
enum { ATT_WIDE = ATT_ROWS * ATT_COLS };

MRL_KERNEL static void row_scores(float *restrict s, const float *a, const float *restrict bt,
                                  int64_t ldb, int64_t ldc, int hd, int64_t cols, float scale) {
  int64_t c0 = 0;
  for (; c0 + ATT_WIDE <= cols; c0 += ATT_WIDE) {
    float acc[ATT_ROWS][ATT_COLS] = {{0}};
    for (int d = 0; d < hd; d++) {
      const float *b = bt + (int64_t)d * ldb + c0 / ATT_COLS * ldc;
      float x = a[d];
      ATT_UNROLL_ROWS
      for (int t = 0; t < ATT_ROWS; t++) {
        const float *bc = b + t * ldc;
        ATT_UNROLL_COLS
        for (int u = 0; u < ATT_COLS; u++) acc[t][u] += x * bc[u];
      }
    }
    for (int t = 0; t < ATT_ROWS; t++)
      for (int u = 0; u < ATT_COLS; u++) s[c0 + t * ATT_COLS + u] = acc[t][u] * scale;
  }
  for (; c0 < cols; c0 += ATT_COLS) {
    float acc[ATT_COLS] = {0};
    for (int d = 0; d < hd; d++) {
      const float *b = bt + (int64_t)d * ldb + c0 / ATT_COLS * ldc;
      float x = a[d];
      for (int u = 0; u < ATT_COLS; u++) acc[u] += x * b[u];
    }
    for (int u = 0; u < ATT_COLS; u++) s[c0 + u] = acc[u] * scale;
  }
}

MRL_KERNEL static void row_combine(float *restrict o, const float *p, const float *restrict v,
                                   int64_t ldv, int hp, int last) {
  int d0 = 0;
  for (; d0 + ATT_WIDE <= hp; d0 += ATT_WIDE) {
    float acc[ATT_ROWS][ATT_COLS] = {{0}};
    for (int k = 0; k <= last; k++) {
      const float *vk = v + (int64_t)k * ldv + d0;
      float x = p[k];
      ATT_UNROLL_ROWS
      for (int t = 0; t < ATT_ROWS; t++) {
        ATT_UNROLL_COLS
        for (int u = 0; u < ATT_COLS; u++) acc[t][u] += x * vk[t * ATT_COLS + u];
      }
    }
    for (int t = 0; t < ATT_ROWS; t++)
      for (int u = 0; u < ATT_COLS; u++) o[d0 + t * ATT_COLS + u] = acc[t][u];
  }
  for (; d0 < hp; d0 += ATT_COLS) {
    float acc[ATT_COLS] = {0};
    for (int k = 0; k <= last; k++) {
      const float *vk = v + (int64_t)k * ldv + d0;
      float x = p[k];
      for (int u = 0; u < ATT_COLS; u++) acc[u] += x * vk[u];
    }
    for (int u = 0; u < ATT_COLS; u++) o[d0 + u] = acc[u];
  }
}

/* acc (keys, hp) += w^T x over the tile's first n rows: acc[k][d] += w[r][k] x[r][d] for
 * k <= last + r, in the order of r. x (ATT_ROWS, hp); rows past n of w and x are zero. */
MRL_KERNEL static void tile_update(float *restrict acc, int hp, const float *const w[ATT_ROWS],
                                   const float *restrict x, int n, int last) {
  const float *x0 = x, *x1 = x + hp, *x2 = x + 2 * hp, *x3 = x + 3 * hp;
  for (int k = 0; k <= last; k++) {
    float *a = acc + (int64_t)k * hp;
    float c0 = w[0][k], c1 = w[1][k], c2 = w[2][k], c3 = w[3][k];
    for (int d0 = 0; d0 < hp; d0 += ATT_COLS) {
      ATT_UNROLL_COLS
      for (int u = 0; u < ATT_COLS; u++) {
        int d = d0 + u;
        a[d] = a[d] + c0 * x0[d] + c1 * x1[d] + c2 * x2[d] + c3 * x3[d];
      }
    }
  }
  for (int k = last + 1; k < last + n; k++) {
    float *a = acc + (int64_t)k * hp;
    for (int r = k - last; r < n; r++) {
      float c = w[r][k];
      for (int d = 0; d < hp; d++) a[d] += c * x[r * hp + d];
    }
  }
}

/* row[0..last] = softmax(row[0..last]) in place, zero from last + 1 to the end of its column
 * tile (row holds whole tiles). The sum goes into ATT_COLS double lanes, added in lane order.
 * (The lane loops are left to the loop vectorizer, which turns their selects into masks.) */
MRL_KERNEL static void tile_softmax_row(float *restrict row, int last) {
  int64_t cols = round_up(last + 1, ATT_COLS);
  float first = row[0], lane_max[ATT_COLS];
  for (int u = 0; u < ATT_COLS; u++) lane_max[u] = first;
  for (int64_t c0 = 0; c0 < cols; c0 += ATT_COLS)
    for (int u = 0; u < ATT_COLS; u++) {
      float v = row[c0 + u];
      v = c0 + u <= last ? v : first;
      lane_max[u] = v > lane_max[u] ? v : lane_max[u];
    }
  float mx = first;
  for (int u = 0; u < ATT_COLS; u++) mx = lane_max[u] > mx ? lane_max[u] : mx;
  double lane_sum[ATT_COLS] = {0};
  for (int64_t c0 = 0; c0 < cols; c0 += ATT_COLS)
    for (int u = 0; u < ATT_COLS; u++) {
      float e = mrl__exp_kernel(row[c0 + u] - mx);
      e = c0 + u <= last ? e : 0.0f;
      row[c0 + u] = e;
      lane_sum[u] += e;
    }
  double sum = 0.0;
  for (int u = 0; u < ATT_COLS; u++) sum += lane_sum[u];
  float inv = (float)(1.0 / sum);
  for (int64_t c0 = 0; c0 < cols; c0 += ATT_COLS)
    for (int u = 0; u < ATT_COLS; u++) row[c0 + u] *= inv;
}

/* The softmax backward of one row in place: d[s] = p[s] (d[s] - sum_j p[j] d[j]) scale over
 * `cols` columns (whole tiles; p is zero past the row's range, so d becomes zero there too). */
MRL_KERNEL static void tile_softmax_backward_row(float *restrict d, const float *restrict p,
                                                 int64_t cols, float scale) {
  double lane_dot[ATT_COLS] = {0};
  for (int64_t c0 = 0; c0 < cols; c0 += ATT_COLS)
    for (int u = 0; u < ATT_COLS; u++) lane_dot[u] += (double)p[c0 + u] * d[c0 + u];
  double dot = 0.0;
  for (int u = 0; u < ATT_COLS; u++) dot += lane_dot[u];
  float fdot = (float)dot;
  for (int64_t c0 = 0; c0 < cols; c0 += ATT_COLS)
    for (int u = 0; u < ATT_COLS; u++) d[c0 + u] = p[c0 + u] * (d[c0 + u] - fdot) * scale;
}

/* bt (hd, ldb) = a^T for rows [0, keys) of a (row stride lda); columns past keys are zero. */
static void transpose_rows(float *bt, int64_t ldb, const float *a, int64_t lda, int keys, int hd) {
  for (int d = 0; d < hd; d++) {
    float *row = bt + (int64_t)d * ldb;
    for (int k = 0; k < keys; k++) row[k] = a[(int64_t)k * lda + d];
    memset(row + keys, 0, sizeof(float) * (size_t)(ldb - keys));
  }
}

/* b (rows_b, hp) = rows [0, keys) of a with hd columns, zero-padded to hp columns and rows_b
 * rows. */
static void pad_rows(float *b, int hp, int64_t rows_b, const float *a, int64_t lda, int keys,
                     int hd) {
  for (int64_t k = 0; k < rows_b; k++) {
    float *row = b + k * hp;
    int have = k < keys ? hd : 0;
    if (have) memcpy(row, a + k * lda, sizeof(float) * (size_t)hd);
    memset(row + have, 0, sizeof(float) * (size_t)(hp - have));
  }
}

void mrl__softmax_causal(float *dst, const float *src, int last, int width) {
  float mx = src[0];
  for (int s = 1; s <= last; s++)
    if (src[s] > mx) mx = src[s];
  double sum = 0.0;
  for (int s = 0; s <= last; s++) {
    dst[s] = expf(src[s] - mx);
    sum += dst[s];
  }
  float inv = (float)(1.0 / sum);
  for (int s = 0; s <= last; s++) dst[s] *= inv;
  for (int s = last + 1; s < width; s++) dst[s] = 0.0f; /* causal (and padding) mask */
}

/* ---- forward ---- */

int64_t mrl__attn_key_columns(int keys) { return padded_keys(keys); }

void mrl__attn_transpose_keys(float *kt, int64_t ldkt, const float *k, int64_t ldk, int keys,
                              int hd) {
  transpose_rows(kt, ldkt, k, ldk, keys, hd);
}

int64_t mrl__attn_forward_work(int hd, int keys) {
  int64_t kp = padded_keys(keys), hp = round_up(hd, ATT_COLS);
  return (hd % ATT_COLS ? kp * hp : 0) + ATT_ROWS * kp + ATT_ROWS * hp;
}

void mrl__attn_forward(float *out, int64_t ldo, float *probs, int64_t ldp, int width,
                       const float *q, int64_t ldq, const float *kt, int64_t ldkt, int64_t ldkc,
                       const float *v, int64_t ldv, int rows, int pos, int hd, float *work) {
  int keys = pos + rows, hp = (int)round_up(hd, ATT_COLS);
  int64_t kp = padded_keys(keys);
  float *s = work, *o = s + ATT_ROWS * kp, *vp = o + ATT_ROWS * hp;
  if (hd % ATT_COLS) { /* whole column tiles of v: a zero-padded copy */
    pad_rows(vp, hp, keys, v, ldv, keys, hd);
    v = vp;
    ldv = hp;
  }
  float scale = 1.0f / sqrtf((float)hd);
  for (int i0 = 0; i0 < rows; i0 += ATT_ROWS) {
    int n = rows - i0 < ATT_ROWS ? rows - i0 : ATT_ROWS, last = pos + i0;
    const float *a[ATT_ROWS];
    const float *p[ATT_ROWS];
    for (int r = 0; r < ATT_ROWS; r++) a[r] = q + (int64_t)(i0 + (r < n ? r : n - 1)) * ldq;
    if (n == 1) { /* a single row (decoding): no tile of repeated queries */
      row_scores(s, a[0], kt, ldkt, ldkc, hd, round_up(last + 1, ATT_COLS), scale);
      tile_softmax_row(s, last);
      if (probs) {
        float *dst = probs + (int64_t)i0 * ldp;
        memcpy(dst, s, sizeof(float) * (size_t)(last + 1));
        memset(dst + last + 1, 0, sizeof(float) * (size_t)(width - (last + 1)));
      }
      row_combine(o, s, v, ldv, hp, last);
      memcpy(out + (int64_t)i0 * ldo, o, sizeof(float) * (size_t)hd);
      continue;
    }
    tile_scores(s, kp, a, kt, ldkt, ldkc, hd, round_up(last + ATT_ROWS, ATT_COLS), scale);
    for (int r = 0; r < ATT_ROWS; r++) {
      /* a row past n repeats the last query; its result is dropped */
      float *sr = s + r * kp;
      tile_softmax_row(sr, last + r);
      p[r] = sr;
      if (probs && r < n) {
        float *dst = probs + (int64_t)(i0 + r) * ldp;
        memcpy(dst, sr, sizeof(float) * (size_t)(last + r + 1));
        memset(dst + last + r + 1, 0, sizeof(float) * (size_t)(width - (last + r + 1)));
      }
    }
    tile_combine(o, p, v, ldv, hp, n, last);
    for (int r = 0; r < n; r++)
      memcpy(out + (int64_t)(i0 + r) * ldo, o + r * hp, sizeof(float) * (size_t)hd);
  }
}

int64_t mrl__attn_forward_ref_work(int rows, int keys) { return (int64_t)rows * keys; }

void mrl__attn_forward_ref(float *out, int64_t ldo, float *probs, int64_t ldp, int width,
                           const float *q, int64_t ldq, const float *kt, int64_t ldkt,
                           const float *v, int64_t ldv, int rows, int pos, int hd, float *work) {
  int keys = pos + rows;
  float *p = probs ? probs : work;
  int64_t ld = probs ? ldp : keys;
  float scale = 1.0f / sqrtf((float)hd);
  /* a block of query rows against the keys up to the block's last row (causal: the rest is 0) */
  for (int r0 = 0; r0 < rows; r0 += MRL_ATTN_BLOCK) {
    int r1 = r0 + MRL_ATTN_BLOCK < rows ? r0 + MRL_ATTN_BLOCK : rows;
    mrl__gemm(false, false, r1 - r0, pos + r1, hd, scale, q + (int64_t)r0 * ldq, ldq, kt, ldkt,
              0.0f, p + r0 * ld, ld);
  }
  for (int t = 0; t < rows; t++)
    mrl__softmax_causal(p + t * ld, p + t * ld, pos + t, probs ? width : keys);
  for (int r0 = 0; r0 < rows; r0 += MRL_ATTN_BLOCK) {
    int r1 = r0 + MRL_ATTN_BLOCK < rows ? r0 + MRL_ATTN_BLOCK : rows;
    mrl__gemm(false, false, r1 - r0, hd, pos + r1, 1.0f, p + r0 * ld, ld, v, ldv, 0.0f,
              out + (int64_t)r0 * ldo, ldo);
  }
}

/* ---- backward ---- */

int64_t mrl__attn_backward_work(int hd, int keys) {
  int64_t kp = padded_keys(keys), hp = round_up(hd, ATT_COLS);
  return hd * kp + 3 * kp * hp + 2 * ATT_ROWS * kp + 3 * ATT_ROWS * hp;
}

void mrl__attn_backward(float *dq, int64_t lddq, float *dk, float *dv, int64_t lddkv,
                        const float *dout, int64_t lddo, const float *probs, int64_t ldp,
                        const float *q, int64_t ldq, const float *k, const float *v,
                        int64_t ldkv, int rows, int hd, float *work) {
  int hp = (int)round_up(hd, ATT_COLS);
  int64_t kp = padded_keys(rows);
  float *vt = work, *kpad = vt + hd * kp, *dka = kpad + kp * hp, *dva = dka + kp * hp;
  float *ds = dva + kp * hp, *pt = ds + ATT_ROWS * kp, *qt = pt + ATT_ROWS * kp;
  float *dt = qt + ATT_ROWS * hp, *o = dt + ATT_ROWS * hp;
  transpose_rows(vt, kp, v, ldkv, rows, hd);
  pad_rows(kpad, hp, kp, k, ldkv, rows, hd);
  memset(dka, 0, sizeof(float) * (size_t)(2 * kp * hp));
  float scale = 1.0f / sqrtf((float)hd);
  for (int i0 = 0; i0 < rows; i0 += ATT_ROWS) {
    int n = rows - i0 < ATT_ROWS ? rows - i0 : ATT_ROWS, last = i0;
    int64_t cols = round_up(last + ATT_ROWS, ATT_COLS);
    /* the tile's dout and q rows, zero past n (so they add nothing to dk and dv) */
    pad_rows(dt, hp, ATT_ROWS, dout + (int64_t)i0 * lddo, lddo, n, hd);
    pad_rows(qt, hp, ATT_ROWS, q + (int64_t)i0 * ldq, ldq, n, hd);
    const float *a[ATT_ROWS], *w[ATT_ROWS], *p[ATT_ROWS];
    for (int r = 0; r < ATT_ROWS; r++) a[r] = dt + r * hp;
    /* out = P V: dP = dout V^T */
    tile_scores(ds, kp, a, vt, kp, ATT_COLS, hd, cols, 1.0f);
    /* softmax backward over each causal row: dS = P * (dP - sum_s P dP), times the scale; the
     * tile's probabilities zero-padded to whole column tiles (all zero past n) */
    for (int r = 0; r < ATT_ROWS; r++) {
      float *pr = pt + r * kp, *dr = ds + r * kp;
      int have = r < n ? last + r + 1 : 0;
      if (have) memcpy(pr, probs + (int64_t)(i0 + r) * ldp, sizeof(float) * (size_t)have);
      memset(pr + have, 0, sizeof(float) * (size_t)(cols - have));
      tile_softmax_backward_row(dr, pr, cols, scale);
      w[r] = pr;
      p[r] = dr;
    }
    /* dV += P^T dout */
    tile_update(dva, hp, w, dt, n, last);
    /* S = q k^T: dq = dS k, dk += dS^T q */
    tile_combine(o, p, kpad, hp, hp, n, last);
    for (int r = 0; r < n; r++)
      memcpy(dq + (int64_t)(i0 + r) * lddq, o + r * hp, sizeof(float) * (size_t)hd);
    tile_update(dka, hp, p, qt, n, last);
  }
  for (int s = 0; s < rows; s++)
    for (int d = 0; d < hd; d++) {
      dk[(int64_t)s * lddkv + d] += dka[(int64_t)s * hp + d];
      dv[(int64_t)s * lddkv + d] += dva[(int64_t)s * hp + d];
    }
}

int64_t mrl__attn_backward_ref_work(int rows) { return (int64_t)rows * rows; }

void mrl__attn_backward_ref(float *dq, int64_t lddq, float *dk, float *dv, int64_t lddkv,
                            const float *dout, int64_t lddo, const float *probs, int64_t ldp,
                            const float *q, int64_t ldq, const float *k, const float *v,
                            int64_t ldkv, int rows, int hd, float *work) {
  float scale = 1.0f / sqrtf((float)hd);
  int64_t ld = rows;
  /* blocks of query rows [r0, r1) against the keys [0, r1), as in the forward pass */
  for (int r0 = 0; r0 < rows; r0 += MRL_ATTN_BLOCK) {
    int r1 = r0 + MRL_ATTN_BLOCK < rows ? r0 + MRL_ATTN_BLOCK : rows, n = r1 - r0;
    const float *pb = probs + (int64_t)r0 * ldp, *db = dout + (int64_t)r0 * lddo;
    float *dpb = work + r0 * ld;
    /* out = P V: dP = dout V^T, dV += P^T dout */
    mrl__gemm(false, true, n, r1, hd, 1.0f, db, lddo, v, ldkv, 0.0f, dpb, ld);
    mrl__gemm(true, false, r1, hd, n, 1.0f, pb, ldp, db, lddo, 1.0f, dv, lddkv);
    /* softmax backward over each causal row: dS = P * (dP - sum_s P dP), times the scale */
    for (int t = r0; t < r1; t++) {
      const float *pr = probs + (int64_t)t * ldp;
      float *dr = work + t * ld;
      double dot = 0.0;
      for (int s = 0; s <= t; s++) dot += (double)pr[s] * dr[s];
      for (int s = 0; s <= t; s++) dr[s] = pr[s] * (dr[s] - (float)dot) * scale;
      for (int s = t + 1; s < r1; s++) dr[s] = 0.0f;
    }
    /* S = q k^T: dq = dS k, dk += dS^T q */
    mrl__gemm(false, false, n, hd, r1, 1.0f, dpb, ld, k, ldkv, 0.0f, dq + (int64_t)r0 * lddq,
              lddq);
    mrl__gemm(true, false, r1, hd, n, 1.0f, dpb, ld, q + (int64_t)r0 * ldq, ldq, 1.0f, dk,
              lddkv);
  }
}
