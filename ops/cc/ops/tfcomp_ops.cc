// Op definitions: names, attributes, shape functions and documentation of the tfcomp ops.
#include "ops/cc/kernels/checks.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfcomp {
namespace {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// Checks that input `index`, the op argument `name`, has rank `rank` (when its rank is known).
Status RequireRank(InferenceContext* c, int index, const char* name, int rank) {
  ShapeHandle unused;
  if (!c->WithRank(c->input(index), rank, &unused).ok()) {
    return ::tensorflow::errors::InvalidArgument(name, rank == 0 ? " must be a scalar" : " must be a vector",
                                                 ", got shape ", c->DebugString(c->input(index)));
  }
  return ::tensorflow::OkStatus();
}

// Sets outputs 0 and 1 to vectors of length given by an integer attribute (at most 2^31 - 1).
Status PairOfVectors(InferenceContext* c, const char* length_attr) {
  int64_t length;
  TF_RETURN_IF_ERROR(c->GetAttr(length_attr, &length));
  TF_RETURN_IF_ERROR(CheckLengthAttr(length_attr, length));
  c->set_output(0, c->Vector(length));
  c->set_output(1, c->Vector(length));
  return ::tensorflow::OkStatus();
}

// The grad list's length M (attribute "M"), checking that the addend list (attribute "N") holds no
// tensor or one per grad tensor.
Status GradListLength(InferenceContext* c, int64_t* m) {
  int64_t n;
  TF_RETURN_IF_ERROR(c->GetAttr("M", m));
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  if (n != 0 && n != *m) {
    return ::tensorflow::errors::InvalidArgument("addend must hold no tensor or one per grad tensor (", *m, "), got ",
                                                 n);
  }
  return ::tensorflow::OkStatus();
}

// Outputs 0 to num_outputs - 1 get grad's shape (input 0), merged with the moment inputs that follow
// it (`moment_names`, num_moments of them) and the residual (attribute "N": no tensor or one); a
// mismatch names the input.
Status AccumulateShapes(InferenceContext* c, const char* const* moment_names, int num_moments, int num_outputs) {
  int64_t n;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  if (n > 1) return ::tensorflow::errors::InvalidArgument("residual must hold no tensor or one, got ", n);
  ShapeHandle shape = c->input(0);
  for (int i = 1; i <= num_moments + n; ++i) {
    if (!c->Merge(shape, c->input(i), &shape).ok()) {
      return ::tensorflow::errors::InvalidArgument(i <= num_moments ? moment_names[i - 1] : "residual",
                                                   " must have the shape of grad, ", c->DebugString(c->input(0)),
                                                   ", got ", c->DebugString(c->input(i)));
    }
  }
  for (int i = 0; i < num_outputs; ++i) c->set_output(i, shape);
  return ::tensorflow::OkStatus();
}

constexpr const char* kMomentumNames[] = {"momentum"};
constexpr const char* kAdamMomentNames[] = {"m", "v"};

}  // namespace

REGISTER_OP("Tfcomp>EstimateThreshold")
    .Input("grad: M * T")
    .Input("ratio: float")
    .Input("seed: int64")
    .Input("addend: N * T")
    .Output("threshold: float")
    .Attr("T: {float, half, bfloat16}")
    .Attr("M: int >= 1")
    .Attr("N: int >= 0 = 0")
    .Attr("num_samples: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      int64_t m;
      TF_RETURN_IF_ERROR(GradListLength(c, &m));
      TF_RETURN_IF_ERROR(RequireRank(c, m, "ratio", 0));
      TF_RETURN_IF_ERROR(RequireRank(c, m + 1, "seed", 0));
      c->set_output(0, c->Scalar());
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Estimates the magnitude threshold that keeps a fraction `ratio` of `grad`.

Draws min(num_samples, size) elements by stratified random sampling (one uniform position per
equal stratum, positions from `seed`; every element when num_samples >= size) and returns the
k-th largest |g| among the finite samples, k = max(1, round(ratio * number of samples)).
Non-finite samples are left out (the compressors always select NaN and Inf).

grad: one or more tensors of any shapes, read in place as one gradient, the concatenation of
  their flattened elements (a MergeComp bucket, never concatenated): not empty, at most 2^31 - 1
  elements in all. The result is the one-tensor result of that concatenation.
ratio: float32 scalar in (0, 1] (in host memory on GPU).
seed: int64 scalar; the same seed gives the same sample.
addend: no tensor, or one per grad tensor of its shape, float32 only: the samples are then taken
  from grad + addend (each sum rounded once, as TensorFlow's add gives), which is never stored.
threshold: float32 scalar.
)doc");

REGISTER_OP("Tfcomp>DragonnCompress")
    .Input("grad: M * T")
    .Input("threshold: float")
    .Input("seed: int64")
    .Input("addend: N * T")
    .Output("values: T")
    .Output("indices: int32")
    .Output("sum: N * T")
    .Attr("T: {float, half, bfloat16}")
    .Attr("M: int >= 1")
    .Attr("N: int >= 0 = 0")
    .Attr("num_slots: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      int64_t m;
      TF_RETURN_IF_ERROR(GradListLength(c, &m));
      TF_RETURN_IF_ERROR(RequireRank(c, m, "threshold", 0));
      TF_RETURN_IF_ERROR(RequireRank(c, m + 1, "seed", 0));
      for (int i = 0; i < c->num_outputs() - 2; ++i) c->set_output(2 + i, c->input(i));
      return PairOfVectors(c, "num_slots");
    })
    .Doc(R"doc(
DRAGONN hashing sparsification (004 Algorithm 1).

Every element with |g| >= threshold (NaN and Inf always) writes its flat index into slot h(index)
of num_slots slots, h drawn from a universal hash family by `seed`. On a collision the element of
larger magnitude keeps the slot (NaN above Inf above finite; equal magnitudes: the larger index),
so the output depends only on the inputs. Empty slots hold index -1 and value 0.

grad: one or more tensors of any shapes, read in place as one gradient, the concatenation of
  their flattened elements (a MergeComp bucket, never concatenated), at most 2^31 - 1 elements in
  all; flat indices are into that concatenation.
threshold: float32 finite scalar (on GPU its value stays on the device and is not checked: NaN
  selects every element, +Inf only the non-finite ones).
seed: int64 scalar selecting the hash function.
addend: no tensor, or one per grad tensor of its shape, float32 only: the op then sparsifies
  g = grad + addend (each sum rounded once, as TensorFlow's add gives), computed in the same pass
  that selects (error feedback's gradient plus residual, read once).
num_slots: at most 2^31 - 1.
values: [num_slots], grad's dtype: g[indices], 0 where the index is -1.
indices: [num_slots] int32 flat indices into the concatenated gradient, or -1.
sum: with addends, g, one tensor per grad tensor of its shape; else empty.
)doc");

REGISTER_OP("Tfcomp>DgcCompress")
    .Input("grad: T")
    .Input("threshold: float")
    .Output("values: T")
    .Output("indices: int32")
    .Attr("T: {float, half, bfloat16}")
    .Attr("max_out: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(RequireRank(c, 1, "threshold", 0));
      return PairOfVectors(c, "max_out");
    })
    .Doc(R"doc(
DGC threshold sparsification (004 Algorithm 3): the elements with |g| >= threshold (NaN and Inf
always) in increasing index order, the first max_out of them, padded with index -1 and value 0.

grad: gradient of any shape, at most 2^31 - 1 elements.
threshold: float32 finite scalar (on GPU its value stays on the device and is not checked: NaN
  selects every element, +Inf only the non-finite ones).
max_out: at most 2^31 - 1.
values: [max_out], grad's dtype.
indices: [max_out] int32 flat indices into grad, or -1.
)doc");

REGISTER_OP("Tfcomp>TopkCompress")
    .Input("grad: T")
    .Output("values: T")
    .Output("indices: int32")
    .Attr("T: {float, half, bfloat16}")
    .Attr("k: int >= 1")
    .SetShapeFn([](InferenceContext* c) { return PairOfVectors(c, "k"); })
    .Doc(R"doc(
Exact top-k sparsification: the k elements of largest |g|, returned in increasing index order.
NaN ranks above Inf above finite values; among equal magnitudes the larger index ranks first.

grad: gradient of any shape with at least k and at most 2^31 - 1 elements.
values: [k], grad's dtype.
indices: [k] int32 flat indices into grad.
)doc");

REGISTER_OP("Tfcomp>SparseBatchedDecode")
    .Input("values: T")
    .Input("indices: int32")
    .Output("dense: T")
    .Attr("T: {float, half, bfloat16}")
    .Attr("size: int >= 0")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(RequireRank(c, 0, "values", 1));
      TF_RETURN_IF_ERROR(RequireRank(c, 1, "indices", 1));
      ShapeHandle unused;
      if (!c->Merge(c->input(0), c->input(1), &unused).ok()) {
        return ::tensorflow::errors::InvalidArgument("values and indices must have the same length, got values of shape ",
                                                     c->DebugString(c->input(0)), " and indices of shape ",
                                                     c->DebugString(c->input(1)));
      }
      int64_t size;
      TF_RETURN_IF_ERROR(c->GetAttr("size", &size));
      TF_RETURN_IF_ERROR(CheckLengthAttr("size", size));
      c->set_output(0, c->Vector(size));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Sparse batched decoding (004 Sec. 4.3): the dense sum of all (value, index) pairs, for example the
concatenated payloads of K workers, in one pass. Index -1 is skipped; duplicate indices add up, in
pair order, from 0. An index < -1 or >= size is an InvalidArgument error and nothing is written.

Subnormal sums are flushed to zero on the CPU, where float32 and bfloat16 add in float32 under
TensorFlow's floating-point mode (FTZ and DAZ): a value of magnitude below 2^-126 (1.18e-38) adds as
a zero of its sign, and a sum (partial or final) that lands below it becomes a zero of its sign, so
1.5e-38 + -1.4e-38 gives +0 and -1.5e-38 + 1.4e-38 gives -0. float16 keeps its subnormals (they are
normal float32 values). The GPU kernel does not flush: it keeps float32 and bfloat16 subnormals.

values: [n], float32, float16 or bfloat16.
indices: [n] int32.
size: at most 2^31 - 1.
dense: [size], values' dtype.
)doc");

REGISTER_OP("Tfcomp>ZeroAt")
    .Input("variable: resource")
    .Input("indices: int32")
    .Attr("offset: int >= 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return RequireRank(c, 1, "indices", 1); })
    .Doc(R"doc(
Sets to zero, in place, the elements of a float32 resource variable that `indices` name: element
i - offset for every index i in [offset, offset + variable size); other indices (-1, or those of
the other tensors of a merged bucket) are skipped. Error feedback clears the k sent elements of a
residual this way, in O(k): unlike TensorFlow's resource scatter ops it leaves the variable out of
copy-on-read mode, in which every later read copies it. The buffer is copied first only where
another tensor still shares it.

variable: a float32 resource variable (of any shape), initialized.
indices: [n] int32.
offset: where the variable's elements start in the index space of `indices`.
)doc");

REGISTER_OP("Tfcomp>IntQuantize")
    .Input("grad: float")
    .Input("scale: float")
    .Input("seed: int64")
    .Output("lanes: int32")
    .Attr("bits: int")
    .Attr("levels: int")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(RequireRank(c, 1, "scale", 0));
      TF_RETURN_IF_ERROR(RequireRank(c, 2, "seed", 0));
      int64_t bits;
      TF_RETURN_IF_ERROR(c->GetAttr("bits", &bits));
      const int64_t size = c->Value(c->NumElements(c->input(0)));
      const int64_t fields = bits == 4 || bits == 8 || bits == 16 ? 32 / bits : 1;
      c->set_output(0, c->Vector(size < 0 ? InferenceContext::kUnknownDim : (size + fields - 1) / fields));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
IntQuant's encode: integer levels of `grad` that an integer allreduce can sum (THC, NSDI 2024).

Element i becomes clamp(floor(grad[i] * (levels / scale) + u_i), -levels, levels) with u_i uniform
in [0, 1) from (seed, i) (24 bits of SplitMix64's finaliser of Mix64(seed) + i), so that its
expectation is grad[i] * levels / scale when |grad[i]| <= scale; float32 arithmetic, one rounding
per operation (levels / scale once). A non-finite element, or a scale that is not positive and
finite, gives level 0. 32 / bits levels are packed into each int32,
level j of a lane times 2^(bits j): the sum of K workers' lanes holds the sums of their levels as
long as K * levels <= 2^(bits-1) - 1.

grad: float32 of any shape, at most 2^31 - 1 elements.
scale: float32 scalar, the scale agreed by the workers (at least every |grad[i]|).
seed: int64 scalar; with the element's index it draws the rounding noise.
bits: 4, 8 or 16.
levels: levels on each side of zero, 1 to 2^(bits-1) - 1.
lanes: int32 [ceil(size / (32 / bits))].
)doc");

REGISTER_OP("Tfcomp>IntDequantize")
    .Input("lanes: int32")
    .Input("step: float")
    .Output("dense: float")
    .Attr("bits: int")
    .Attr("size: int >= 0")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(RequireRank(c, 0, "lanes", 1));
      TF_RETURN_IF_ERROR(RequireRank(c, 1, "step", 0));
      int64_t size;
      TF_RETURN_IF_ERROR(c->GetAttr("size", &size));
      TF_RETURN_IF_ERROR(CheckLengthAttr("size", size));
      c->set_output(0, c->Vector(size));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
IntQuant's decode: the signed `bits`-bit fields of int32 lanes (packed by int_quantize, or the
sum of such lanes), lowest first, each times `step`.

lanes: int32 [ceil(size / (32 / bits))].
step: float32 scalar, the value of one level (scale / levels, times 1/K to average).
bits: 4, 8 or 16.
size: elements to unpack, at most 2^31 - 1.
dense: float32 [size].
)doc");

REGISTER_OP("Tfcomp>HashPartition")
    .Input("values: float")
    .Input("indices: int32")
    .Output("rows: int32")
    .Output("splits: int32")
    .Attr("num_parts: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(RequireRank(c, 0, "values", 1));
      TF_RETURN_IF_ERROR(RequireRank(c, 1, "indices", 1));
      int64_t num_parts;
      TF_RETURN_IF_ERROR(c->GetAttr("num_parts", &num_parts));
      TF_RETURN_IF_ERROR(CheckNumParts(num_parts));
      c->set_output(0, c->Matrix(InferenceContext::kUnknownDim, 2));
      c->set_output(1, c->Vector(num_parts));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Partitions (value, index) pairs among num_parts owners by a hash of the index that every rank
shares (Fibonacci hashing, so that one layer's neighbouring indices spread over all owners), for
the hash-partitioned sparse allreduce: `rows` and `splits` are what Horovod's alltoall takes.
Pairs with index -1 (empty slots) are dropped; an index < -1 is an InvalidArgument error.

values: [m] float32.
indices: [m] int32, -1 or a flat index >= 0.
num_parts: the number of owners (ranks), 1 to 2^20 (splits holds one int32 per owner).
rows: [n, 2] int32: (index, the float32 bits of its value) of the n pairs with index >= 0, owner 0's
  first, then owner 1's, ..., in input order within an owner.
splits: [num_parts] int32: how many rows each owner gets.
)doc");

REGISTER_OP("Tfcomp>SumPairs")
    .Input("rows: int32")
    .Output("sums: int32")
    .Attr("max_pairs: int = -1")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle rows;
      ::tensorflow::shape_inference::DimensionHandle width;
      if (!c->WithRank(c->input(0), 2, &rows).ok() || !c->WithValue(c->Dim(rows, 1), 2, &width).ok()) {
        return ::tensorflow::errors::InvalidArgument("rows must have shape [n, 2], got shape ",
                                                     c->DebugString(c->input(0)));
      }
      int64_t max_pairs;
      TF_RETURN_IF_ERROR(c->GetAttr("max_pairs", &max_pairs));
      TF_RETURN_IF_ERROR(CheckMaxPairs(max_pairs));
      c->set_output(0, c->Matrix(InferenceContext::kUnknownDim, 2));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
The owner's step of the hash-partitioned sparse allreduce: the rows every worker sent to this
owner (hash_partition's, after Horovod's alltoall) summed per index, at most max_pairs of the sums
kept, the largest in magnitude (NaN above +Inf above every finite value; equal magnitudes to the
lower index). Each sum is 0 plus the values in row order, one float32 rounding per addition (as
unsorted_segment_sum adds them; denormals flushed as on TensorFlow's CPU threads).

rows: [n, 2] int32, (index >= 0, the float32 bits of a value) per row; a negative index is an
  InvalidArgument error.
max_pairs: -1 to keep every sum, else at most this many.
sums: [m, 2] int32, (index, the float32 bits of the sum of its values) for the m kept distinct
  indices, in ascending index order.
)doc");

REGISTER_OP("Tfcomp>MomentumAccumulate")
    .Input("grad: float")
    .Input("momentum: float")
    .Input("residual: N * float")
    .Output("new_momentum: float")
    .Output("accumulated: float")
    .Attr("mu: float")
    .Attr("N: int >= 0 = 0")
    .SetShapeFn([](InferenceContext* c) { return AccumulateShapes(c, kMomentumNames, 1, 2); })
    .Doc(R"doc(
Error feedback's accumulation under DGC's momentum correction, in one pass: the new momentum
u' = mu * u + g and the accumulated gradient r + u', each operation one float32 operation rounded
to nearest (no fused multiply-add), as TensorFlow's mul and add give them.

grad: float32 of any shape, at most 2^31 - 1 elements.
momentum: float32 of grad's shape, u.
residual: no tensor, or one float32 tensor of grad's shape, r (none: the accumulated gradient is u').
mu: the momentum coefficient (float32).
new_momentum: u', grad's shape.
accumulated: r + u' (u' itself, the same tensor, without a residual), grad's shape.
)doc");

REGISTER_OP("Tfcomp>AdamAccumulate")
    .Input("grad: float")
    .Input("m: float")
    .Input("v: float")
    .Input("residual: N * float")
    .Input("m_correction: float")
    .Input("v_correction: float")
    .Output("new_m: float")
    .Output("new_v: float")
    .Output("accumulated: float")
    .Attr("beta_1: float")
    .Attr("one_minus_beta_1: float")
    .Attr("beta_2: float")
    .Attr("one_minus_beta_2: float")
    .Attr("epsilon: float")
    .Attr("N: int >= 0 = 0")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(AccumulateShapes(c, kAdamMomentNames, 2, 3));
      int64_t n;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      TF_RETURN_IF_ERROR(RequireRank(c, 3 + n, "m_correction", 0));
      return RequireRank(c, 4 + n, "v_correction", 0);
    })
    .Doc(R"doc(
Error feedback's accumulation under the Adam correction, in one pass: m' = beta_1 m + (1 - beta_1) g,
v' = beta_2 v + (1 - beta_2) g^2 and the accumulated gradient r + d of Adam's bias-corrected direction
d = (m' / m_correction) / (sqrt(v' / v_correction) + epsilon), each operation one float32 operation
rounded to nearest (no fused multiply-add; sqrt correctly rounded).

grad: float32 of any shape, at most 2^31 - 1 elements.
m, v: float32 of grad's shape, Adam's moments.
residual: no tensor, or one float32 tensor of grad's shape, r (none: the accumulated gradient is d).
m_correction, v_correction: float32 scalars, 1 - beta_1^t and 1 - beta_2^t of the step t (on a GPU
  they stay in device memory).
beta_1, beta_2, epsilon: Adam's coefficients (float32).
one_minus_beta_1, one_minus_beta_2: 1 - beta_1 and 1 - beta_2 rounded once to float32 from the
  exact difference of the coefficients as given (not from their float32 roundings).
new_m, new_v: m' and v', grad's shape.
accumulated: r + d (d without a residual), grad's shape.
)doc");

REGISTER_OP("Tfcomp>TimeAfter")
    .Input("tensors: T")
    .Output("seconds: double")
    .Attr("T: list(type) >= 1")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
The time, in seconds since the Unix epoch (as tf.timestamp), at which the op runs: once every
tensor of `tensors` has been computed, since they are its data inputs. tf.timestamp under
tf.control_dependencies says the same only where Grappler keeps the control edges: in a
tf.function its dependency optimizer can drop them, and the timestamp then runs whenever. The
tensors are not read (on a GPU the time is when their kernels were queued).

tensors: one or more tensors of any dtypes and shapes.
seconds: float64 scalar.
)doc");

}  // namespace tfcomp

// What this library was built against, read from the file by tfcomp/ops.py before loading it, so
// that a library built for another TensorFlow fails with an explanation instead of a symbol error.
extern "C" __attribute__((used, visibility("default"))) const char tfcomp_build_info[] =
    "TFCOMP_BUILD_INFO{tf=" TFCOMP_TF_VERSION "}";
