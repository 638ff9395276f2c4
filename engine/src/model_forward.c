/* model_forward.c - the decoder's forward pass over a right-padded batch, keeping the activations
 * the backward pass needs, and the LM head (log-probabilities, entropies, logits) computed in
 * blocks of rows. */
#include "model.h"

#include <math.h>
#include <string.h>

void mrl__model_free_activations(mrl_model *m) {
  (void)m;
}
