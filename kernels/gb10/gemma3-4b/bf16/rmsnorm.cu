// Gemma 3 RMSNorm: Gemma stores its norm weights as offsets from one, so the scale is
// (1 + w). This is common/rmsnorm.cu compiled with another constant; it replaces the common
// module of the same stem (declared in this directory's KERNEL.toml [shadow]).
//
// The relative include works in the tree and in the stage alike: common is staged to
// stage/common/ and this leaf to stage/<source model>/<quant>/.
#define RMSNORM_WEIGHT_OFFSET 1.0f
#include "../../common/rmsnorm.cu"
