/* attention.c - causal attention of one head over one sequence, the decoder block's attention:
 * scores = q k^T / sqrt(hd) over the causal range, softmax, out = p v, as matrix products through
 * mrl__gemm (OpenBLAS, or the portable kernel). */
#include "model.h"

#include <math.h>
#include <string.h>

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

int64_t mrl__attn_forward_ref_work(int rows, int keys) { return (int64_t)rows * keys; }

void mrl__attn_forward_ref(float *out, int64_t ldo, float *probs, int64_t ldp, int width,
                           const float *q, int64_t ldq, const float *k, const float *v,
                           int64_t ldkv, int rows, int pos, int hd, float *work) {
  int keys = pos + rows;
  float *p = probs ? probs : work;
  int64_t ld = probs ? ldp : keys;
  float scale = 1.0f / sqrtf((float)hd);
  /* a block of query rows against the keys up to the block's last row (causal: the rest is 0) */
  for (int r0 = 0; r0 < rows; r0 += MRL_ATTN_BLOCK) {
    int r1 = r0 + MRL_ATTN_BLOCK < rows ? r0 + MRL_ATTN_BLOCK : rows;
    mrl__gemm(false, true, r1 - r0, pos + r1, hd, scale, q + (int64_t)r0 * ldq, ldq, k, ldkv,
              0.0f, p + r0 * ld, ld);
  }
  for (int t = 0; t < rows; t++)
    mrl__softmax_causal(p + t * ld, p + t * ld, pos + t, probs ? width : keys);
  for (int r0 = 0; r0 < rows; r0 += MRL_ATTN_BLOCK) {
    int r1 = r0 + MRL_ATTN_BLOCK < rows ? r0 + MRL_ATTN_BLOCK : rows;
    mrl__gemm(false, false, r1 - r0, hd, pos + r1, 1.0f, p + r0 * ld, ld, v, ldkv, 0.0f,
              out + (int64_t)r0 * ldo, ldo);
  }
}
