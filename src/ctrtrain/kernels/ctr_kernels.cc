// Fused CPU kernels for the sparse half of a CTR training step (issue 27).
//
// The pure-TensorFlow path (tables.py, optimizers.py) spends most of the step's non-MLP time in
// dozens of small ops over a batch's few thousand distinct table rows: each op is a pass over
// memory plus per-op overhead. These kernels do the same arithmetic in one pass each:
//
//   CtrUnique            a batch's distinct ids and where each id is among them (tf.unique)
//   CtrScaledGather      out[n] = params[where[n]] * values[n]      (the block of a batch)
//   CtrScaledSegmentSum  out[u] = sum_{where[n] = u} grad[n] * values[n]   (its gradient)
//   CtrHeld              a batch's bag ids without their padding, and where each is
//   CtrBagPool(Grad)     each bag's rows weighted and pooled (sum, mean, sqrtn), and its gradient
//   CtrFm, CtrFmGrad     the FM's first- and second-order terms of the block, and their gradient
//   CtrAdamCatchupRead   the catch-up of Adam's skipped steps for the rows about to be read
//                        (optimizers.py Adam._decayed_math, _AdamDrift, Adam._idle_l2)
//   CtrAdamCatchupApply  Adam's step on those rows, in place (optimizers.py Adam._sparse)
//   CtrAdamDense         Adam's step on a dense variable with its L2 and its held rows folded
//                        into the gradient (optimizers.py Adam._dense_with_terms)
//   CtrDice(Grad)        DIN's Dice activation, batch statistics and all, and its gradient
//   CtrFieldAttention(Grad)  AutoInt's softmax attention over the fields per head, and its
//                        gradient
//   CtrDropout           dropout with its mask drawn from a seed in the same pass (and its
//                        gradient: the same op, the same seed, on the incoming gradient)
//   CtrReluDropoutGrad   an MLP layer's gradient through dropout, ReLU and the bias in one
//                        pass: dz and the bias's gradient (was three ops and three passes)
//   CtrOuterProduct(Grad) xDeepFM's CIN's row-wise outer products written in one pass, and
//                        their gradient in one pass over the incoming gradient (was two Muls
//                        and two Sums)
//   CtrPairProduct(Grad) the CIN's first layer's products of the fields with themselves, each
//                        distinct pair once (half the matmul), and their gradient
//
// The TensorFlow path stays the reference: tests/test_kernels.py compares both to float32
// precision. Built against the installed TensorFlow by build.py beside this file.

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace ctrtrain {

using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::Var;
using tensorflow::errors::InvalidArgument;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

namespace {

// Splits [0, total) over the CPU device's intra-op threads.
void ParallelRows(OpKernelContext* ctx, int64_t total, int64_t cost_per_row,
                  const std::function<void(int64_t, int64_t)>& work) {
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  tensorflow::Shard(workers->num_threads, workers->workers, total, cost_per_row, work);
}

// Locks variables in address order (as TensorFlow's own multi-variable ops do) so that no two
// ops can deadlock.
template <typename Lock>
class OrderedLocks {
 public:
  explicit OrderedLocks(const std::vector<Var*>& vars) {
    std::vector<tensorflow::mutex*> mus;
    for (Var* v : vars) mus.push_back(v->mu());
    std::sort(mus.begin(), mus.end());
    mus.erase(std::unique(mus.begin(), mus.end()), mus.end());
    for (auto* mu : mus) locks_.emplace_back(new Lock(*mu));
  }

 private:
  std::vector<std::unique_ptr<Lock>> locks_;
};
// Aliases: TensorFlow defines mutex_lock(x) as a macro that catches unnamed locks.
using Locks = OrderedLocks<tensorflow::mutex_lock>;             // to write
using SharedLocks = OrderedLocks<tensorflow::tf_shared_lock>;   // to read

// Before an in-place sparse write, as TensorFlow's EnsureSparseVariableAccess: a buffer some
// earlier read still shares is copied first, and the variable is put in copy-on-read mode
// (reads copy, so writes can stay in place). Caller holds the variable's lock.
bool MakeWritable(OpKernelContext* ctx, Var* var) {
  Tensor* t = var->tensor();
  if (var->copy_on_read_mode.load() || t->RefCountIsOne()) {
    var->copy_on_read_mode.store(true);
    return true;
  }
  Tensor copy;
  auto status = ctx->allocate_temp(t->dtype(), t->shape(), &copy);
  if (!status.ok()) {
    ctx->SetStatus(status);
    return false;
  }
  std::memcpy(copy.data(), t->data(), t->TotalBytes());
  *t = copy;
  var->copy_on_read_mode.store(true);
  return true;
}

// Before an in-place dense write, as TensorFlow's dense training ops (PrepareToUpdateVariable):
// a buffer a read still shares is copied first (copy on write), and the variable is NOT put in
// copy-on-read mode, where every later read of it would copy the whole variable. Caller holds
// the variable's lock.
bool MakeWritableDense(OpKernelContext* ctx, Var* var) {
  Tensor* t = var->tensor();
  if (!var->copy_on_read_mode.load() && t->RefCountIsOne()) return true;
  Tensor copy;
  auto status = ctx->allocate_temp(t->dtype(), t->shape(), &copy);
  if (!status.ok()) {
    ctx->SetStatus(status);
    return false;
  }
  std::memcpy(copy.data(), t->data(), t->TotalBytes());
  *t = copy;
  return true;
}

bool LookupVar(OpKernelContext* ctx, int input, tensorflow::core::RefCountPtr<Var>* var) {
  auto status = tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, input), var);
  if (!status.ok()) ctx->SetStatus(status);
  return status.ok();
}

// Every row index in [0, limit), else an error naming the first that is not.
template <typename Index>
bool CheckRows(OpKernelContext* ctx, const Index* rows, int64_t n, int64_t limit,
               const char* what) {
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] < 0 || rows[i] >= limit) {
      ctx->SetStatus(InvalidArgument(what, " index ", rows[i], " at ", i,
                                     " is outside [0, ", limit, ")"));
      return false;
    }
  }
  return true;
}

float DivNoNan(float x, float y) { return y == 0.0f ? 0.0f : x / y; }

// dst += src * w over n floats.
inline void AddScaled(float* __restrict dst, const float* __restrict src, float w, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i] * w;
}

// A loop compiled also for AVX2 and AVX-512, the one for this CPU picked when the library
// loads (gcc target_clones): the element-wise loops with Exp or 64-bit multiplies run 2-4x
// faster in the wider registers than in the baseline's SSE2.
#if defined(__x86_64__)
#define CTR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CTR_CLONES
#endif

// exp(x) in float32 within 2 ulp (Cephes' expf: Cody-Waite reduction and a degree-5
// polynomial) without calls or branches, so that the loop using it is vectorized (std::exp is
// one call per element, most of the catch-up's time with L2). x is clamped to [-87, 88].
inline float Exp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float t = x * 1.44269504088896341f + 0.5f;
  int32_t n = static_cast<int32_t>(t);
  n -= static_cast<int32_t>(static_cast<float>(n) > t);       // floor
  const float nf = static_cast<float>(n);
  x = x - nf * 0.693359375f + nf * 2.12194440e-4f;
  const float y = ((((((1.9875691500e-4f * x + 1.3981999507e-3f) * x + 8.3334519073e-3f) * x +
                      4.1665795894e-2f) * x + 1.6666665459e-1f) * x + 5.0000001201e-1f) *
                   x * x) + x + 1.0f;
  const int32_t bits = (n + 127) << 23;                      // 2^n
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// A batch's distinct ids: tf.unique's result (first occurrences in order, int32 positions)
// from an open-addressing table sized to the batch, instead of a general hash map.

REGISTER_OP("CtrUnique")
    .Input("ids: int64")
    .Output("distinct: int64")
    .Output("where: int32")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle ids;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &ids));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, ids);
      return absl::OkStatus();
    });

class Unique : public OpKernel {
 public:
  explicit Unique(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids_t = ctx->input(0);
    const int64_t n = ids_t.NumElements();
    OP_REQUIRES(ctx, n < (int64_t{1} << 31), InvalidArgument("more ids than int32 positions"));
    int bits = 4;
    while ((int64_t{1} << bits) < 2 * n) ++bits;
    const uint64_t mask = (uint64_t{1} << bits) - 1;
    std::vector<int64_t> keys(mask + 1);
    std::vector<int32_t> position(mask + 1, -1);   // of the key in `distinct`; -1: empty slot
    std::vector<int64_t> distinct;
    distinct.reserve(n);
    Tensor* where_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, ids_t.shape(), &where_t));
    const int64_t* ids = ids_t.flat<int64_t>().data();
    int32_t* where = where_t->flat<int32_t>().data();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = ids[i];
      // Fibonacci hashing: the product's high bits, linear probing.
      uint64_t h = (static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull) >> (64 - bits);
      while (position[h] >= 0 && keys[h] != id) h = (h + 1) & mask;
      if (position[h] < 0) {
        position[h] = static_cast<int32_t>(distinct.size());
        keys[h] = id;
        distinct.push_back(id);
      }
      where[i] = position[h];
    }
    Tensor* distinct_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({static_cast<int64_t>(distinct.size())}), &distinct_t));
    std::copy(distinct.begin(), distinct.end(), distinct_t->flat<int64_t>().data());
  }
};

REGISTER_KERNEL_BUILDER(Name("CtrUnique").Device(DEVICE_CPU), Unique);

// ---------------------------------------------------------------------------------------------
// The batch's block and its gradient.

REGISTER_OP("CtrScaledGather")
    .Input("params: float")
    .Input("where: Tidx")
    .Input("values: float")
    .Output("out: float")
    .Attr("Tidx: {int32, int64}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle params, where;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &params));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &where));
      c->set_output(0, c->Matrix(c->Dim(where, 0), c->Dim(params, 1)));
      return absl::OkStatus();
    });

template <typename Tidx>
class ScaledGather : public OpKernel {
 public:
  explicit ScaledGather(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& params = ctx->input(0);
    const Tensor& where = ctx->input(1);
    const Tensor& values = ctx->input(2);
    const int64_t rows = params.dim_size(0), width = params.dim_size(1), n = where.NumElements();
    OP_REQUIRES(ctx, values.NumElements() == n,
                InvalidArgument("values has ", values.NumElements(), " elements, where has ", n));
    const Tidx* w = where.flat<Tidx>().data();
    if (!CheckRows(ctx, w, n, rows, "where")) return;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, width}), &out));
    const float* p = params.flat<float>().data();
    const float* x = values.flat<float>().data();
    float* o = out->flat<float>().data();
    ParallelRows(ctx, n, 4 * width, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const float* src = p + static_cast<int64_t>(w[i]) * width;
        float* dst = o + i * width;
        const float s = x[i];
        for (int64_t j = 0; j < width; ++j) dst[j] = src[j] * s;
      }
    });
  }
};

REGISTER_KERNEL_BUILDER(
    Name("CtrScaledGather").Device(DEVICE_CPU).TypeConstraint<int32_t>("Tidx"),
    ScaledGather<int32_t>);
REGISTER_KERNEL_BUILDER(
    Name("CtrScaledGather").Device(DEVICE_CPU).TypeConstraint<int64_t>("Tidx"),
    ScaledGather<int64_t>);

REGISTER_OP("CtrScaledSegmentSum")
    .Input("grad: float")
    .Input("where: Tidx")
    .Input("values: float")
    .Input("num_rows: int64")
    .Output("out: float")
    .Attr("Tidx: {int32, int64}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle grad;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &grad));
      c->set_output(0, c->Matrix(c->UnknownDim(), c->Dim(grad, 1)));
      return absl::OkStatus();
    });

// Summed in the order of n, as UnsortedSegmentSum over the product grad * values sums it: the
// same float32 result.
template <typename Tidx>
class ScaledSegmentSum : public OpKernel {
 public:
  explicit ScaledSegmentSum(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad = ctx->input(0);
    const Tensor& where = ctx->input(1);
    const Tensor& values = ctx->input(2);
    const int64_t rows = ctx->input(3).scalar<int64_t>()();
    const int64_t width = grad.dim_size(1), n = where.NumElements();
    OP_REQUIRES(ctx, grad.dim_size(0) == n && values.NumElements() == n,
                InvalidArgument("grad, where and values disagree on the number of rows"));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({rows, width}), &out));
    const Tidx* w = where.flat<Tidx>().data();
    const float* g = grad.flat<float>().data();
    const float* x = values.flat<float>().data();
    float* o = out->flat<float>().data();
    std::fill(o, o + rows * width, 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, w[i] >= 0 && w[i] < rows,
                  InvalidArgument("where index ", w[i], " at ", i, " is outside [0, ", rows, ")"));
      float* dst = o + static_cast<int64_t>(w[i]) * width;
      const float* src = g + i * width;
      const float s = x[i];
      for (int64_t j = 0; j < width; ++j) dst[j] += src[j] * s;
    }
  }
};

REGISTER_KERNEL_BUILDER(
    Name("CtrScaledSegmentSum").Device(DEVICE_CPU).TypeConstraint<int32_t>("Tidx"),
    ScaledSegmentSum<int32_t>);
REGISTER_KERNEL_BUILDER(
    Name("CtrScaledSegmentSum").Device(DEVICE_CPU).TypeConstraint<int64_t>("Tidx"),
    ScaledSegmentSum<int64_t>);

// ---------------------------------------------------------------------------------------------
// Bags (multi_hot and sequence fields; tables.py EmbeddingTable._pooled): each bag's held ids'
// rows times their weights, summed, divided by the weights' sum (mean) or the root of their
// squares' sum (sqrtn), 0 for a bag whose divisor is 0 -- in one pass over the held ids instead
// of a GatherNd, a Gather, a Mul, three UnsortedSegmentSums and divide_no_nan (whose gradient
// alone is five ops). The gradient goes straight to the distinct rows the ids were read from.
//
// held [V, 2] is each held id's (example, column) in bag_ids [B, C]; where [V] its row among
// the distinct rows; bag_of_column[c] the bag column c belongs to; poolings[j] bag j's pooling
// (0 sum, 1 mean, 2 sqrtn). Sums run in the order of the held ids, as UnsortedSegmentSum's do.

// The held ids of bag_ids [B, C] (-1 the padding): their (example, column) in row-major
// order and the ids, as tf.where(bag_ids >= 0) and a GatherNd give them, in one pass.
REGISTER_OP("CtrHeld")
    .Input("bag_ids: int64")    // [B, C]
    .Output("held: int64")      // [V, 2]
    .Output("ids: int64")       // [V]
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle ids;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &ids));
      c->set_output(0, c->Matrix(c->UnknownDim(), 2));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    });

class Held : public OpKernel {
 public:
  explicit Held(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids_t = ctx->input(0);
    const int64_t columns = ids_t.dim_size(1), n = ids_t.NumElements();
    const int64_t* ids = ids_t.flat<int64_t>().data();
    int64_t count = 0;
    for (int64_t i = 0; i < n; ++i) count += ids[i] >= 0;
    Tensor *held_t = nullptr, *out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({count, 2}), &held_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({count}), &out_t));
    int64_t* held = held_t->flat<int64_t>().data();
    int64_t* out = out_t->flat<int64_t>().data();
    for (int64_t i = 0, v = 0; i < n; ++i) {
      if (ids[i] < 0) continue;
      held[2 * v] = i / columns;
      held[2 * v + 1] = i % columns;
      out[v++] = ids[i];
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("CtrHeld").Device(DEVICE_CPU), Held);

REGISTER_OP("CtrBagPool")
    .Input("rows: float")       // [U, W] the batch's distinct rows
    .Input("where: int32")      // [V]
    .Input("held: int64")       // [V, 2]
    .Input("weights: float")    // [B, C]
    .Output("pooled: float")    // [B, bags, W]
    .Output("denom: float")     // [B, bags] what each bag's sum was divided by (1 for sum)
    .Attr("bag_of_column: list(int)")
    .Attr("poolings: list(int)")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle rows, weights;
      std::vector<int32_t> poolings;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &rows));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 2, &weights));
      TF_RETURN_IF_ERROR(c->GetAttr("poolings", &poolings));
      const int64_t bags = static_cast<int64_t>(poolings.size());
      c->set_output(0, c->MakeShape({c->Dim(weights, 0), bags, c->Dim(rows, 1)}));
      c->set_output(1, c->MakeShape({c->Dim(weights, 0), bags}));
      return absl::OkStatus();
    });

// Reads and checks the attributes and the held ids both bag kernels share.
class BagKernel : public OpKernel {
 public:
  explicit BagKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bag_of_column", &bag_of_column_));
  }

 protected:
  // Every held (example, column) inside [B, C] and every where inside [0, rows).
  bool CheckHeld(OpKernelContext* ctx, const Tensor& held, const Tensor& where, int64_t batch,
                 int64_t columns, int64_t rows) {
    if (columns != static_cast<int64_t>(bag_of_column_.size())) {
      ctx->SetStatus(InvalidArgument("the bags have ", bag_of_column_.size(),
                                     " columns, their weights ", columns));
      return false;
    }
    const int64_t n = where.NumElements();
    if (held.dim_size(0) != n || held.dim_size(1) != 2) {
      ctx->SetStatus(InvalidArgument("held is ", held.shape().DebugString(), ", where has ", n,
                                     " elements"));
      return false;
    }
    const int64_t* h = held.flat<int64_t>().data();
    for (int64_t v = 0; v < n; ++v) {
      if (h[2 * v] < 0 || h[2 * v] >= batch || h[2 * v + 1] < 0 || h[2 * v + 1] >= columns) {
        ctx->SetStatus(InvalidArgument("held id ", v, " at (", h[2 * v], ", ", h[2 * v + 1],
                                       ") is outside [", batch, ", ", columns, "]"));
        return false;
      }
    }
    return CheckRows(ctx, where.flat<int32_t>().data(), n, rows, "where");
  }

  std::vector<int32_t> bag_of_column_;
};

class BagPool : public BagKernel {
 public:
  explicit BagPool(OpKernelConstruction* ctx) : BagKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("poolings", &poolings_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows_t = ctx->input(0);
    const Tensor& where_t = ctx->input(1);
    const Tensor& held_t = ctx->input(2);
    const Tensor& weights_t = ctx->input(3);
    const int64_t width = rows_t.dim_size(1), batch = weights_t.dim_size(0);
    const int64_t columns = weights_t.dim_size(1), bags = poolings_.size();
    if (!CheckHeld(ctx, held_t, where_t, batch, columns, rows_t.dim_size(0))) return;
    Tensor *pooled_t = nullptr, *denom_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, bags, width}), &pooled_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({batch, bags}), &denom_t));
    const float* rows = rows_t.flat<float>().data();
    const int32_t* where = where_t.flat<int32_t>().data();
    const int64_t* held = held_t.flat<int64_t>().data();
    const float* weights = weights_t.flat<float>().data();
    float* pooled = pooled_t->flat<float>().data();
    float* denom = denom_t->flat<float>().data();
    const int64_t n = where_t.NumElements();
    std::fill(pooled, pooled + batch * bags * width, 0.0f);
    // The divisors: the weights' sum (mean) or their squares' (sqrtn), 1 for sum.
    bool divides = false;
    for (int32_t p : poolings_) divides |= p != 0;
    std::vector<float> sums(divides ? batch * bags : 0, 0.0f);
    for (int64_t v = 0; v < n; ++v) {
      const int64_t b = held[2 * v], c = held[2 * v + 1];
      const float w = weights[b * columns + c];
      const int64_t s = b * bags + bag_of_column_[c];
      if (divides) sums[s] += poolings_[bag_of_column_[c]] == 2 ? w * w : w;
      AddScaled(pooled + s * width, rows + static_cast<int64_t>(where[v]) * width, w, width);
    }
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t j = 0; j < bags; ++j) {
        const int64_t s = b * bags + j;
        const int32_t p = poolings_[j];
        denom[s] = p == 0 ? 1.0f : (p == 1 ? sums[s] : std::sqrt(sums[s]));
        if (p == 0) continue;
        float* out = pooled + s * width;
        for (int64_t k = 0; k < width; ++k) out[k] = DivNoNan(out[k], denom[s]);
      }
    }
  }

 private:
  std::vector<int32_t> poolings_;
};

REGISTER_KERNEL_BUILDER(Name("CtrBagPool").Device(DEVICE_CPU), BagPool);

REGISTER_OP("CtrBagPoolGrad")
    .Input("grad: float")       // [B, bags, W] the pooled bags' gradient
    .Input("where: int32")
    .Input("held: int64")
    .Input("weights: float")
    .Input("denom: float")      // CtrBagPool's
    .Input("num_rows: int64")
    .Output("d_rows: float")    // [num_rows, W]
    .Attr("bag_of_column: list(int)")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle grad;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &grad));
      c->set_output(0, c->Matrix(c->UnknownDim(), c->Dim(grad, 2)));
      return absl::OkStatus();
    });

// d rows[where[v]] += divide_no_nan(grad[bag of v], denom[bag of v]) * weight[v], in the order
// of v: what TensorFlow's gradients of divide_no_nan, the Mul and the Gather sum to.
class BagPoolGrad : public BagKernel {
 public:
  using BagKernel::BagKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad_t = ctx->input(0);
    const Tensor& where_t = ctx->input(1);
    const Tensor& held_t = ctx->input(2);
    const Tensor& weights_t = ctx->input(3);
    const Tensor& denom_t = ctx->input(4);
    const int64_t rows = ctx->input(5).scalar<int64_t>()();
    const int64_t batch = grad_t.dim_size(0), bags = grad_t.dim_size(1);
    const int64_t width = grad_t.dim_size(2), columns = weights_t.dim_size(1);
    OP_REQUIRES(ctx, weights_t.dim_size(0) == batch && denom_t.NumElements() == batch * bags,
                InvalidArgument("grad, weights and denom disagree on the batch"));
    if (!CheckHeld(ctx, held_t, where_t, batch, columns, rows)) return;
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({rows, width}), &out_t));
    const float* grad = grad_t.flat<float>().data();
    const int32_t* where = where_t.flat<int32_t>().data();
    const int64_t* held = held_t.flat<int64_t>().data();
    const float* weights = weights_t.flat<float>().data();
    const float* denom = denom_t.flat<float>().data();
    float* out = out_t->flat<float>().data();
    std::fill(out, out + rows * width, 0.0f);
    for (int64_t v = 0, n = where_t.NumElements(); v < n; ++v) {
      const int64_t b = held[2 * v], c = held[2 * v + 1];
      const int64_t s = b * bags + bag_of_column_[c];
      if (denom[s] == 0.0f) continue;      // divide_no_nan's zero
      AddQuotient(out + static_cast<int64_t>(where[v]) * width, grad + s * width, denom[s],
                  weights[b * columns + c], width);
    }
  }

 private:
  static void AddQuotient(float* __restrict dst, const float* __restrict g, float d, float w,
                          int64_t width) {
    for (int64_t k = 0; k < width; ++k) dst[k] += g[k] / d * w;
  }
};

REGISTER_KERNEL_BUILDER(Name("CtrBagPoolGrad").Device(DEVICE_CPU), BagPoolGrad);

// ---------------------------------------------------------------------------------------------
// The factorization machine's terms of a block [B, F, W] (blocks.py first_and_fm): the sum of
// column 0 (the first-order weights, with first_order) and 1/2 sum_k [(sum_f e_fk)^2 -
// sum_f e_fk^2] over the other columns (all of them without first_order), in one pass; and
// their gradient, d e_fk = d_fm (sum_f' e_f'k - e_fk) (d_first on column 0).

REGISTER_OP("CtrFm")
    .Input("block: float")
    .Output("first: float")     // [B] (zeros without first_order)
    .Output("fm: float")        // [B]
    .Output("summed: float")    // [B, W] sum over fields, kept for the gradient
    .Attr("first_order: bool")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle block;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &block));
      c->set_output(0, c->Vector(c->Dim(block, 0)));
      c->set_output(1, c->Vector(c->Dim(block, 0)));
      c->set_output(2, c->Matrix(c->Dim(block, 0), c->Dim(block, 2)));
      return absl::OkStatus();
    });

class Fm : public OpKernel {
 public:
  explicit Fm(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("first_order", &first_order_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& block_t = ctx->input(0);
    const int64_t b = block_t.dim_size(0), f = block_t.dim_size(1), w = block_t.dim_size(2);
    Tensor *first_t, *fm_t, *summed_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({b}), &first_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({b}), &fm_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({b, w}), &summed_t));
    const float* block = block_t.flat<float>().data();
    float* first = first_t->flat<float>().data();
    float* fm = fm_t->flat<float>().data();
    float* summed = summed_t->flat<float>().data();
    const int64_t k0 = first_order_ ? 1 : 0;
    ParallelRows(ctx, b, 3 * f * w, [&](int64_t lo, int64_t hi) {
      std::vector<float> squares(w);
      for (int64_t i = lo; i < hi; ++i) {
        float* sum = summed + i * w;
        SumFields(block + i * f * w, f, w, sum, squares.data());
        float total = 0;
        for (int64_t k = k0; k < w; ++k) total += sum[k] * sum[k] - squares[k];
        fm[i] = 0.5f * total;
        first[i] = first_order_ ? sum[0] : 0.0f;
      }
    });
  }

 private:
  // sum and sum of squares over the fields of one example's [F, W] rows.
  static void SumFields(const float* __restrict rows, int64_t f, int64_t w, float* __restrict sum,
                        float* __restrict squares) {
    std::fill(sum, sum + w, 0.0f);
    std::fill(squares, squares + w, 0.0f);
    for (int64_t j = 0; j < f; ++j) {
      const float* row = rows + j * w;
      for (int64_t k = 0; k < w; ++k) {
        sum[k] += row[k];
        squares[k] += row[k] * row[k];
      }
    }
  }

  bool first_order_;
};

REGISTER_KERNEL_BUILDER(Name("CtrFm").Device(DEVICE_CPU), Fm);

REGISTER_OP("CtrFmGrad")
    .Input("block: float")
    .Input("summed: float")
    .Input("d_first: float")
    .Input("d_fm: float")
    .Output("d_block: float")
    .Attr("first_order: bool")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    });

class FmGrad : public OpKernel {
 public:
  explicit FmGrad(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("first_order", &first_order_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& block_t = ctx->input(0);
    const int64_t b = block_t.dim_size(0), f = block_t.dim_size(1), w = block_t.dim_size(2);
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, block_t.shape(), &out_t));
    const float* block = block_t.flat<float>().data();
    const float* summed = ctx->input(1).flat<float>().data();
    const float* d_first = ctx->input(2).flat<float>().data();
    const float* d_fm = ctx->input(3).flat<float>().data();
    float* out = out_t->flat<float>().data();
    const int64_t k0 = first_order_ ? 1 : 0;
    ParallelRows(ctx, b, 2 * f * w, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        for (int64_t j = 0; j < f; ++j) {
          const int64_t at = (i * f + j) * w;
          Row(w, k0, d_fm[i], summed + i * w, block + at, out + at);
          if (first_order_) out[at] = d_first[i];
        }
      }
    });
  }

 private:
  static void Row(int64_t w, int64_t k0, float d_fm, const float* __restrict sum,
                  const float* __restrict row, float* __restrict out) {
    for (int64_t k = k0; k < w; ++k) out[k] = d_fm * (sum[k] - row[k]);
  }

  bool first_order_;
};

REGISTER_KERNEL_BUILDER(Name("CtrFmGrad").Device(DEVICE_CPU), FmGrad);

// ---------------------------------------------------------------------------------------------
// Adam with catch-up table updates (optimizers.py). Both moments of a table row share one slot
// row [m (width), v (width)]; last_step holds the step that last updated each row.

REGISTER_OP("CtrAdamCatchupRead")
    .Input("stored: float")         // [U, W] the rows as stored
    .Input("moments: resource")     // [rows, 2W]
    .Input("last_step: resource")   // [rows] int64
    .Input("rows: int64")           // [U] distinct
    .Input("iterations: int64")     // steps done before this one
    .Input("lr_scale: float")
    .Input("learning_rate: float")  // base rate x lr_scale
    .Input("drift: double")         // [3, T + 1]: G_r, G_b1, H (optimizers.py _AdamDrift)
    .Input("ratios: double")        // [2]: beta1 / sqrt(beta2), beta1
    .Output("offset: float")        // stored - offset = the rows as dense Adam would have them
    .Output("m: float")             // the rows' moments after the skipped steps
    .Output("v: float")
    .Output("current: float")       // [U, W] the caught-up rows with table_l2, else [0, W]
    .Attr("beta1: float")
    .Attr("beta2: float")
    .Attr("epsilon: float")
    .Attr("table_l2: float")
    .SetIsStateful()   // reads variables: never folded, merged or reordered past their writes
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle stored;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &stored));
      for (int i = 0; i < 3; ++i) c->set_output(i, stored);
      c->set_output(3, c->Matrix(c->UnknownDim(), c->Dim(stored, 1)));
      return absl::OkStatus();
    });

// The same catch-up, reading the rows from the table itself: the embedding lookup and the
// catch-up in one pass over the batch's rows (instead of a ResourceGather, then this read, then
// a subtraction). `now` is what the lookup returns; its gradient is the table's IndexedSlices
// (kernels/__init__.py registers it).
REGISTER_OP("CtrAdamCatchupLookup")
    .Input("table: resource")       // [rows, W]
    .Input("moments: resource")     // [rows, 2W]
    .Input("last_step: resource")   // [rows] int64
    .Input("rows: int64")           // [U] distinct
    .Input("iterations: int64")
    .Input("lr_scale: float")
    .Input("learning_rate: float")
    .Input("drift: double")
    .Input("ratios: double")
    .Output("now: float")           // [U, W] the rows as dense Adam would have them
    .Output("offset: float")        // stored - offset = now
    .Output("m: float")
    .Output("v: float")
    .Attr("beta1: float")
    .Attr("beta2: float")
    .Attr("epsilon: float")
    .Attr("table_l2: float")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      auto* handle = c->input_handle_shapes_and_types(0);
      auto width = handle && !handle->empty() && c->RankKnown((*handle)[0].shape)
                       ? c->Dim((*handle)[0].shape, 1) : c->UnknownDim();
      ShapeHandle rows;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &rows));
      for (int i = 0; i < 4; ++i) c->set_output(i, c->Matrix(c->Dim(rows, 0), width));
      return absl::OkStatus();
    });

// One row's element-wise work, in functions of their own over restrict pointers so that the
// compiler vectorizes them (in the kernels' lambdas it cannot prove the rows apart).
struct RowTerms {
  float d_r, eps_ratio, lr_scale, b1k, b2k;   // the drift and the moments' decay
  float rate, eps_w, moved, l2;               // Adam._idle_l2 (with table L2)
};

void CatchupRow(int64_t width, const RowTerms& c, const float* __restrict m_in,
                const float* __restrict v_in, float* __restrict offset, float* __restrict m_out,
                float* __restrict v_out) {
  for (int64_t j = 0; j < width; ++j) {
    const float m = m_in[j], v = v_in[j];
    offset[j] = DivNoNan(m * c.d_r, std::sqrt(v) + c.eps_ratio) * c.lr_scale;
    m_out[j] = c.b1k * m;
    v_out[j] = c.b2k * v;
  }
}

// CatchupRow, also writing the row now (stored - offset): the lookup's output.
void CatchupRowNow(int64_t width, const RowTerms& c, const float* __restrict stored,
                   const float* __restrict m_in, const float* __restrict v_in,
                   float* __restrict offset, float* __restrict m_out, float* __restrict v_out,
                   float* __restrict now) {
  for (int64_t j = 0; j < width; ++j) {
    const float m = m_in[j], v = v_in[j];
    const float o = DivNoNan(m * c.d_r, std::sqrt(v) + c.eps_ratio) * c.lr_scale;
    offset[j] = o;
    m_out[j] = c.b1k * m;
    v_out[j] = c.b2k * v;
    now[j] = stored[j] - o;
  }
}

void CatchupRowL2(int64_t width, const RowTerms& c, const float* __restrict stored,
                  const float* __restrict m_in, const float* __restrict v_in,
                  float* __restrict offset, float* __restrict m_out, float* __restrict v_out,
                  float* __restrict current) {
  for (int64_t j = 0; j < width; ++j) {
    const float m = m_in[j], v = v_in[j], root_v = std::sqrt(v);
    const float drift = DivNoNan(m * c.d_r, root_v + c.eps_ratio) * c.lr_scale;
    const float theta = stored[j] - drift;
    const float e = DivNoNan(c.rate, root_v + c.eps_w);
    float size = std::fabs(theta);
    size = std::max(std::max(size * Exp(-e), size - c.moved), 0.0f);
    const float shrunk = std::copysign(size, theta);   // size is 0 where theta is
    const float grad = c.l2 * shrunk;
    m_out[j] = c.b1k * m + (1.0f - c.b1k) * grad;
    v_out[j] = c.b2k * v + (1.0f - c.b2k) * grad * grad;
    offset[j] = stored[j] - shrunk;
    current[j] = shrunk;
  }
}

struct AdamTerms {
  float beta1, beta2, one_b1, one_b2, lr, epsilon, l2;
};

// Without L2, l2_rows is grad and a.l2 is 0: no branch in the loop.
void AdamRow(int64_t width, const AdamTerms& a, const float* __restrict grad,
             const float* __restrict l2_rows, const float* __restrict m_in,
             const float* __restrict v_in, const float* __restrict offset, float* __restrict row,
             float* __restrict m_row, float* __restrict v_row) {
  for (int64_t j = 0; j < width; ++j) {
    const float g = grad[j] + a.l2 * l2_rows[j];
    const float m = a.beta1 * m_in[j] + a.one_b1 * g;
    const float v = a.beta2 * v_in[j] + a.one_b2 * g * g;
    m_row[j] = m;
    v_row[j] = v;
    row[j] -= offset[j] + a.lr * m / (std::sqrt(v) + a.epsilon);
  }
}

// What a row's catch-up needs from its skipped steps k alone (the same for every row that
// skipped k steps): tabulated once per kernel for k <= T, computed directly beyond.
struct SkippedSteps {
  float b1k, b2k;    // beta1^k, beta2^k
  double c_r, c_b1;  // (beta1 / sqrt(beta2))^k, beta1^k in float64 (_AdamDrift.sums)
  float w1, w0;      // Adam._idle_l2's sums over the skipped steps
};

// How far ahead of the row being computed its successors' memory is requested: a batch's rows
// are scattered over a table of millions, so each is a cache miss the prefetch overlaps.
constexpr int64_t kAhead = 8;

// kLookup: CtrAdamCatchupLookup (the rows read from the table; `now` written), else
// CtrAdamCatchupRead (the stored rows given).
template <bool kLookup>
class AdamCatchup : public OpKernel {
 public:
  explicit AdamCatchup(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("beta1", &beta1_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("beta2", &beta2_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_l2", &l2_));
    // Adam._idle_l2's q and its cap on k (q^k stays finite).
    q_d_ = std::pow(static_cast<double>(beta2_), -0.5);
    k_cap_ = static_cast<float>(80.0 / std::log(q_d_));
  }

  // In float64, then rounded: the TensorFlow ops' float32 sums lose up to 1e-5 of w1 to
  // q^k - 1 with q - 1 = 5e-4 (beta2 0.999); tabulated once, the precision costs nothing.
  SkippedSteps Skipped(int64_t k, double c_r, double c_b1) const {
    SkippedSteps s;
    const double kd = static_cast<double>(k), b1 = beta1_;
    s.b1k = static_cast<float>(std::pow(b1, kd));
    s.b2k = static_cast<float>(std::pow(static_cast<double>(beta2_), kd));
    s.c_r = std::pow(c_r, kd);
    s.c_b1 = std::pow(c_b1, kd);
    const double kq = std::min(kd, static_cast<double>(k_cap_)), b1q = b1 * q_d_;
    s.w1 = static_cast<float>(q_d_ * (std::pow(q_d_, kq) - 1) / (q_d_ - 1) -
                              b1q * (1 - std::pow(b1q, kq)) / (1 - b1q));
    s.w0 = static_cast<float>(kd - b1 * (1 - std::pow(b1, kd)) / (1 - b1));
    return s;
  }

  void Compute(OpKernelContext* ctx) override {
    tensorflow::core::RefCountPtr<Var> table, moments, last_step;
    if (!LookupVar(ctx, 1, &moments) || !LookupVar(ctx, 2, &last_step)) return;
    if (kLookup && !LookupVar(ctx, 0, &table)) return;
    // Read under shared locks (address-ordered, as CtrAdamCatchupApply's exclusive ones):
    // the apply writes in place in copy-on-read mode, so whatever is read is copied here.
    std::vector<Var*> read{moments.get(), last_step.get()};
    if (kLookup) read.push_back(table.get());
    SharedLocks locks(read);
    const Tensor& stored_t = kLookup ? *table->tensor() : ctx->input(0);
    OP_REQUIRES(ctx, stored_t.dims() == 2, InvalidArgument("the rows must be a matrix"));
    const Tensor& rows_t = ctx->input(3);
    const int64_t u = rows_t.NumElements(), width = stored_t.dim_size(1);
    OP_REQUIRES(ctx, kLookup || stored_t.dim_size(0) == u,
                InvalidArgument("rows has ", u, " elements, stored ", stored_t.dim_size(0)));
    const int64_t iterations = ctx->input(4).scalar<int64_t>()();
    const float lr_scale = ctx->input(5).scalar<float>()();
    const float learning_rate = ctx->input(6).scalar<float>()();
    const Tensor& drift_t = ctx->input(7);
    OP_REQUIRES(ctx, drift_t.dims() == 2 && drift_t.dim_size(0) == 3,
                InvalidArgument("drift must be [3, T + 1]"));
    const int64_t T = drift_t.dim_size(1) - 1;
    const double* G_r = drift_t.flat<double>().data();
    const double* G_b1 = G_r + (T + 1);
    const double* H = G_b1 + (T + 1);
    const double c_r = ctx->input(8).flat<double>()(0), c_b1 = ctx->input(8).flat<double>()(1);
    {
      tensorflow::mutex_lock tabulating(mu_);
      if (by_k_.empty()) {
        by_k_.reserve(T + 1);
        for (int64_t k = 0; k <= T; ++k) by_k_.push_back(Skipped(k, c_r, c_b1));
      }
    }
    const int64_t tabulated = static_cast<int64_t>(by_k_.size());

    // Outputs: the lookup's (now, offset, m, v; with L2 the current rows are `now`), the
    // read's (offset, m, v, current: [0, W] without L2).
    const TensorShape shape({u, width});
    Tensor *now_t = nullptr, *offset_t, *m_t, *v_t, *current_t = nullptr;
    const int first = kLookup ? 1 : 0;
    if (kLookup) OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &now_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(first, shape, &offset_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(first + 1, shape, &m_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(first + 2, shape, &v_t));
    if (!kLookup)
      OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({l2_ ? u : 0, width}), &current_t));

    const Tensor& mom = *moments->tensor();
    const Tensor& last = *last_step->tensor();
    OP_REQUIRES(ctx, mom.dims() == 2 && mom.dim_size(1) == 2 * width &&
                         last.NumElements() == mom.dim_size(0) &&
                         (!kLookup || stored_t.dim_size(0) == mom.dim_size(0)),
                InvalidArgument("moments must be [rows, 2 * width] and last_step [rows]"));
    const int64_t* rows = rows_t.flat<int64_t>().data();
    if (!CheckRows(ctx, rows, u, mom.dim_size(0), "rows")) return;

    const float* stored = stored_t.flat<float>().data();
    const float* mv = mom.flat<float>().data();
    const int64_t* last_of = last.flat<int64_t>().data();
    float* offset = offset_t->flat<float>().data();
    float* m_out = m_t->flat<float>().data();
    float* v_out = v_t->flat<float>().data();
    float* now = kLookup ? now_t->flat<float>().data() : nullptr;
    float* current = !l2_ ? nullptr : kLookup ? now : current_t->flat<float>().data();

    // Adam._idle_l2's rate at this step, in float32 as the TensorFlow ops compute it.
    const float t = static_cast<float>(std::max<int64_t>(iterations, 1));
    const float lr_t = learning_rate * std::sqrt(1.0f - std::pow(beta2_, t)) /
                       (1.0f - std::pow(beta1_, t));

    ParallelRows(ctx, u, 40 * width, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        if (i + kAhead < hi) {
          const int64_t next = rows[i + kAhead];
          __builtin_prefetch(last_of + next);
          __builtin_prefetch(mv + next * 2 * width);
          __builtin_prefetch(mv + next * 2 * width + width);
          if (kLookup) __builtin_prefetch(stored + next * width);
        }
        const int64_t r = rows[i], a = last_of[r];
        const int64_t k = std::max<int64_t>(iterations - a, 0);
        const SkippedSteps s = k < tabulated ? by_k_[k] : Skipped(k, c_r, c_b1);
        // _AdamDrift.sums: D_c(a, k) = G_c(a) - c^k G_c(a + k), in float64.
        const int64_t ia = std::min(a, T), iak = std::min(a + k, T);
        const float d_r = static_cast<float>(G_r[ia] - s.c_r * G_r[iak]);
        const float d_b1 = static_cast<float>(G_b1[ia] - s.c_b1 * G_b1[iak]);
        RowTerms c{d_r, epsilon_ * DivNoNan(d_r, d_b1), lr_scale, s.b1k, s.b2k, 0, 0, 0, l2_};
        const int64_t at = i * width;
        const float* m_in = mv + r * 2 * width;
        const float* row = stored + (kLookup ? r : i) * width;
        if (!l2_) {
          if (kLookup) {
            CatchupRowNow(width, c, row, m_in, m_in + width, offset + at, m_out + at,
                          v_out + at, now + at);
          } else {
            CatchupRow(width, c, m_in, m_in + width, offset + at, m_out + at, v_out + at);
          }
          continue;
        }
        // Adam._idle_l2's per-row terms.
        const double h = H[std::min(k, T)] + static_cast<double>(std::max<int64_t>(k - T, 0));
        c.moved = a == 0 ? learning_rate * static_cast<float>(k) : lr_t * static_cast<float>(h);
        c.eps_w = epsilon_ * DivNoNan(s.w1, s.w0);
        c.rate = lr_t * l2_ * s.w1;
        CatchupRowL2(width, c, row, m_in, m_in + width, offset + at, m_out + at, v_out + at,
                     current + at);
      }
    });
  }

 private:
  float beta1_, beta2_, epsilon_, l2_;
  double q_d_;
  float k_cap_;
  tensorflow::mutex mu_;
  std::vector<SkippedSteps> by_k_;   // filled once, then only read
};

REGISTER_KERNEL_BUILDER(Name("CtrAdamCatchupRead").Device(DEVICE_CPU).HostMemory("iterations"),
                        AdamCatchup<false>);
REGISTER_KERNEL_BUILDER(Name("CtrAdamCatchupLookup").Device(DEVICE_CPU).HostMemory("iterations"),
                        AdamCatchup<true>);

REGISTER_OP("CtrAdamCatchupApply")
    .Input("var: resource")         // [rows, W]
    .Input("moments: resource")     // [rows, 2W]
    .Input("last_step: resource")   // [rows] int64
    .Input("rows: int64")           // [U] distinct
    .Input("grad: float")           // [U, W] summed per row
    .Input("m: float")              // CtrAdamCatchupRead's outputs for these rows
    .Input("v: float")
    .Input("offset: float")
    .Input("current: float")
    .Input("iterations: int64")     // this step's number t
    .Input("lr: float")             // lr sqrt(1 - beta2^t) / (1 - beta1^t)
    .Attr("beta1: float")
    .Attr("beta2: float")
    .Attr("epsilon: float")
    .Attr("table_l2: float")
    .SetIsStateful()   // writes variables and has no outputs: never pruned
    .SetShapeFn([](InferenceContext* c) { return absl::OkStatus(); });

class AdamCatchupApply : public OpKernel {
 public:
  explicit AdamCatchupApply(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("beta1", &beta1_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("beta2", &beta2_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_l2", &l2_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows_t = ctx->input(3);
    const Tensor& grad_t = ctx->input(4);
    const int64_t u = rows_t.NumElements();
    OP_REQUIRES(ctx, grad_t.dims() == 2 && grad_t.dim_size(0) == u,
                InvalidArgument("grad must be [rows, width]"));
    const int64_t width = grad_t.dim_size(1);
    for (int i = 5; i < 8; ++i) {
      OP_REQUIRES(ctx, ctx->input(i).shape() == grad_t.shape(),
                  InvalidArgument("m, v and offset must have grad's shape"));
    }
    OP_REQUIRES(ctx, !l2_ || ctx->input(8).shape() == grad_t.shape(),
                InvalidArgument("current must have grad's shape with table_l2"));
    const int64_t step = ctx->input(9).scalar<int64_t>()();
    const float lr = ctx->input(10).scalar<float>()();

    tensorflow::core::RefCountPtr<Var> var, moments, last_step;
    if (!LookupVar(ctx, 0, &var) || !LookupVar(ctx, 1, &moments) || !LookupVar(ctx, 2, &last_step))
      return;
    Locks locks({var.get(), moments.get(), last_step.get()});
    const Tensor& table = *var->tensor();
    OP_REQUIRES(ctx, table.dims() == 2 && table.dim_size(1) == width &&
                         moments->tensor()->dim_size(0) == table.dim_size(0) &&
                         moments->tensor()->dim_size(1) == 2 * width &&
                         last_step->tensor()->NumElements() == table.dim_size(0),
                InvalidArgument("var [rows, width], moments [rows, 2 width] and last_step [rows] "
                                "disagree with grad"));
    const int64_t* rows = rows_t.flat<int64_t>().data();
    if (!CheckRows(ctx, rows, u, table.dim_size(0), "rows")) return;
    if (!MakeWritable(ctx, var.get()) || !MakeWritable(ctx, moments.get()) ||
        !MakeWritable(ctx, last_step.get()))
      return;

    float* w = var->tensor()->flat<float>().data();
    float* mv = moments->tensor()->flat<float>().data();
    int64_t* last = last_step->tensor()->flat<int64_t>().data();
    const float* g = grad_t.flat<float>().data();
    const float* m_in = ctx->input(5).flat<float>().data();
    const float* v_in = ctx->input(6).flat<float>().data();
    const float* offset = ctx->input(7).flat<float>().data();
    // Without L2 its term is l2_ (0) x grad: no branch in the loop, which stays vectorized.
    const float* l2_rows = l2_ ? ctx->input(8).flat<float>().data() : g;
    const AdamTerms terms{beta1_, beta2_, static_cast<float>(1 - static_cast<double>(beta1_)),
                          static_cast<float>(1 - static_cast<double>(beta2_)), lr, epsilon_, l2_};

    ParallelRows(ctx, u, 20 * width, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        if (i + kAhead < hi) {
          const int64_t next = rows[i + kAhead];
          __builtin_prefetch(w + next * width, 1);
          __builtin_prefetch(mv + next * 2 * width, 1);
          __builtin_prefetch(mv + next * 2 * width + width, 1);
          __builtin_prefetch(last + next, 1);
        }
        const int64_t r = rows[i], at = i * width;
        float* m_row = mv + r * 2 * width;
        AdamRow(width, terms, g + at, l2_rows + at, m_in + at, v_in + at, offset + at,
                w + r * width, m_row, m_row + width);
        last[r] = step;
      }
    });
  }

 private:
  float beta1_, beta2_, epsilon_, l2_;
};

REGISTER_KERNEL_BUILDER(Name("CtrAdamCatchupApply")
                            .Device(DEVICE_CPU)
                            .HostMemory("iterations")
                            .HostMemory("lr"),
                        AdamCatchupApply);

// ---------------------------------------------------------------------------------------------
// Adam's step on a dense variable [rows, width] in place, with what the model adds to its
// gradient folded in (optimizers.py Adam._dense_with_terms): g = grad x row_mask + l2 x var,
// the L2 of l2_dense (the gradient of l2 tf.nn.l2_loss(var)) and the MLP's first kernel's rows
// held at zero (blocks.py MLP input_mask). TensorFlow ran these as four element-wise passes
// over the kernel (the mask's product forward and back, L2's product, their sum) before
// ResourceApplyAdam's own: here one pass does all. m and v as ResourceApplyAdam keeps them;
// lr is lr sqrt(1 - beta2^t) / (1 - beta1^t).
REGISTER_OP("CtrAdamDense")
    .Input("var: resource")         // [rows, width]
    .Input("m: resource")           // var's shape
    .Input("v: resource")
    .Input("grad: float")           // var's shape
    .Input("row_mask: float")       // [rows]: 1 keeps a row's gradient, 0 holds the row; [0]: all
    .Input("lr: float")
    .Attr("beta1: float")
    .Attr("beta2: float")
    .Attr("epsilon: float")
    .Attr("l2: float")
    .SetIsStateful()   // writes variables and has no outputs: never pruned
    .SetShapeFn([](InferenceContext* c) { return absl::OkStatus(); });

class AdamDense : public OpKernel {
 public:
  explicit AdamDense(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("beta1", &beta1_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("beta2", &beta2_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("l2", &l2_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad_t = ctx->input(3);
    const Tensor& mask_t = ctx->input(4);
    const float lr = ctx->input(5).scalar<float>()();
    tensorflow::core::RefCountPtr<Var> var, m_var, v_var;
    if (!LookupVar(ctx, 0, &var) || !LookupVar(ctx, 1, &m_var) || !LookupVar(ctx, 2, &v_var))
      return;
    Locks locks({var.get(), m_var.get(), v_var.get()});
    const Tensor& w_t = *var->tensor();
    OP_REQUIRES(ctx, w_t.dtype() == tensorflow::DT_FLOAT && w_t.shape() == grad_t.shape() &&
                         m_var->tensor()->shape() == w_t.shape() &&
                         v_var->tensor()->shape() == w_t.shape(),
                InvalidArgument("var, m, v and grad must be float32 of one shape, not ",
                                w_t.shape().DebugString(), " and grad ",
                                grad_t.shape().DebugString()));
    const int64_t rows = w_t.dims() == 0 ? 1 : w_t.dim_size(0);
    const int64_t width = rows == 0 ? 0 : w_t.NumElements() / rows;
    const bool masked = mask_t.NumElements() > 0;
    OP_REQUIRES(ctx, !masked || mask_t.NumElements() == rows,
                InvalidArgument("row_mask must have one value per row of var (", rows,
                                ") or none, not ", mask_t.NumElements()));
    if (!MakeWritableDense(ctx, var.get()) || !MakeWritableDense(ctx, m_var.get()) ||
        !MakeWritableDense(ctx, v_var.get()))
      return;
    float* w = var->tensor()->flat<float>().data();
    float* m = m_var->tensor()->flat<float>().data();
    float* v = v_var->tensor()->flat<float>().data();
    const float* g = grad_t.flat<float>().data();
    const float* mask = masked ? mask_t.flat<float>().data() : nullptr;
    const float one_b1 = static_cast<float>(1 - static_cast<double>(beta1_));
    const float one_b2 = static_cast<float>(1 - static_cast<double>(beta2_));
    ParallelRows(ctx, rows, 12 * width, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t at = r * width;
        AdamDenseRow(width, mask ? mask[r] : 1.0f, l2_, one_b1, one_b2, lr, epsilon_, g + at,
                     w + at, m + at, v + at);
      }
    });
  }

  // One row: separate buffers (restrict), so the loop is vectorized. ResourceApplyAdam's own
  // arithmetic: m += (g - m)(1 - beta1), v += (g^2 - v)(1 - beta2), w -= lr m / (sqrt v + eps).
  static void AdamDenseRow(int64_t width, float keep, float l2, float one_b1, float one_b2,
                           float lr, float eps, const float* __restrict g, float* __restrict w,
                           float* __restrict m, float* __restrict v) {
    for (int64_t j = 0; j < width; ++j) {
      const float gj = keep * g[j] + l2 * w[j];
      const float mj = m[j] + (gj - m[j]) * one_b1;
      const float vj = v[j] + (gj * gj - v[j]) * one_b2;
      m[j] = mj;
      v[j] = vj;
      w[j] -= lr * mj / (std::sqrt(vj) + eps);
    }
  }

 private:
  float beta1_, beta2_, epsilon_, l2_;
};

REGISTER_KERNEL_BUILDER(Name("CtrAdamDense").Device(DEVICE_CPU).HostMemory("lr"), AdamDense);

// ---------------------------------------------------------------------------------------------
// Dice, DIN's activation (models/blocks.py Dice): out = s (alpha + (1 - alpha) p), p =
// sigmoid((s - mean) / sqrt(var + eps)) per unit, mean and var over the rows weighted by mask
// (the history's held items) in training, given (the moving averages) in inference. TensorFlow
// runs it as some thirty element-wise ops over [rows, units] forward and back: two thirds of
// DIN's attention time. Here: three passes forward, two back.
//
// The gradient, t = dL/dz = g s (1 - alpha) p (1 - p), r = (var + eps)^-1/2, n = sum mask:
//   ds    = g (alpha + (1 - alpha) p) + t r                          (mean and var held)
//           + mask (dmean + 2 dvar (s - mean)) / n                   (through them, training)
//   dmean = -r sum t + dvar (-2 sum mask (s - mean) / n),  dvar = -r^3 / 2 sum t (s - mean)
//   dalpha = sum g s (1 - p)

REGISTER_OP("CtrDice")
    .Input("s: float")            // [N, units]
    .Input("mask: float")         // [N]
    .Input("alpha: float")        // [units]
    .Input("moving_mean: float")  // [units] (read in inference)
    .Input("moving_var: float")   // [units]
    .Output("out: float")
    .Output("mean: float")        // what was used: the batch's in training
    .Output("var: float")
    .Attr("training: bool")
    .Attr("eps: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle s;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &s));
      c->set_output(0, s);
      c->set_output(1, c->Vector(c->Dim(s, 1)));
      c->set_output(2, c->Vector(c->Dim(s, 1)));
      return absl::OkStatus();
    });

REGISTER_OP("CtrDiceGrad")
    .Input("grad: float")
    .Input("s: float")
    .Input("mask: float")
    .Input("alpha: float")
    .Input("mean: float")         // CtrDice's outputs
    .Input("var: float")
    .Output("d_s: float")
    .Output("d_alpha: float")
    .Attr("training: bool")
    .Attr("eps: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(1));
      c->set_output(1, c->input(3));
      return absl::OkStatus();
    });

class DiceKernel : public OpKernel {
 public:
  explicit DiceKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("training", &training_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("eps", &eps_));
  }

 protected:
  static constexpr int64_t kBlock = 256;    // rows per partial sum

  // sums [K * units] = sum over rows n of add(n, its K partial rows), computed per block of
  // rows on the intra-op threads and then added in block order (the same result each run).
  template <int K, typename Add>
  void ColumnSums(OpKernelContext* ctx, int64_t rows, int64_t units, Add add, float* sums) {
    const int64_t blocks = (rows + kBlock - 1) / kBlock;
    std::vector<float> partial(blocks * K * units, 0.0f);
    ParallelRows(ctx, blocks, kBlock * units * 8, [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi; ++b) {
        float* acc = partial.data() + b * K * units;
        for (int64_t n = b * kBlock, end = std::min(rows, n + kBlock); n < end; ++n) add(n, acc);
      }
    });
    std::fill(sums, sums + K * units, 0.0f);
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t j = 0; j < K * units; ++j) sums[j] += partial[b * K * units + j];
  }

  static float Count(const float* mask, int64_t rows) {
    float n = 0.0f;
    for (int64_t i = 0; i < rows; ++i) n += mask[i];
    return n;
  }

  bool CheckShapes(OpKernelContext* ctx, const Tensor& s, const Tensor& mask,
                   const Tensor& alpha) {
    if (mask.NumElements() != s.dim_size(0) || alpha.NumElements() != s.dim_size(1)) {
      ctx->SetStatus(InvalidArgument("Dice: s is ", s.shape().DebugString(), ", mask ",
                                     mask.shape().DebugString(), ", alpha ",
                                     alpha.shape().DebugString()));
      return false;
    }
    return true;
  }

  bool training_;
  float eps_;
};

class Dice : public DiceKernel {
 public:
  using DiceKernel::DiceKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& s_t = ctx->input(0);
    const Tensor& mask_t = ctx->input(1);
    const Tensor& alpha_t = ctx->input(2);
    if (!CheckShapes(ctx, s_t, mask_t, alpha_t)) return;
    const int64_t rows = s_t.dim_size(0), units = s_t.dim_size(1);
    Tensor *out_t = nullptr, *mean_t = nullptr, *var_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, s_t.shape(), &out_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({units}), &mean_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({units}), &var_t));
    const float* s = s_t.flat<float>().data();
    const float* mask = mask_t.flat<float>().data();
    const float* alpha = alpha_t.flat<float>().data();
    float* mean = mean_t->flat<float>().data();
    float* var = var_t->flat<float>().data();
    if (training_) {
      const float n = Count(mask, rows);
      ColumnSums<1>(ctx, rows, units, [&](int64_t i, float* acc) {
        AddScaled(acc, s + i * units, mask[i], units);
      }, mean);
      for (int64_t j = 0; j < units; ++j) mean[j] = DivNoNan(mean[j], n);
      ColumnSums<1>(ctx, rows, units, [&](int64_t i, float* acc) {
        AddSquaredRow(acc, s + i * units, mean, mask[i], units);
      }, var);
      for (int64_t j = 0; j < units; ++j) var[j] = DivNoNan(var[j], n);
    } else {
      std::memcpy(mean, ctx->input(3).flat<float>().data(), units * sizeof(float));
      std::memcpy(var, ctx->input(4).flat<float>().data(), units * sizeof(float));
    }
    std::vector<float> r(units);
    for (int64_t j = 0; j < units; ++j) r[j] = 1.0f / std::sqrt(var[j] + eps_);
    float* out = out_t->flat<float>().data();
    ParallelRows(ctx, rows, units * 20, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        Row(out + i * units, s + i * units, mean, r.data(), alpha, units);
    });
  }

 private:
  static void AddSquaredRow(float* __restrict acc, const float* __restrict s,
                            const float* __restrict mean, float w, int64_t units) {
    for (int64_t j = 0; j < units; ++j) acc[j] += (s[j] - mean[j]) * (s[j] - mean[j]) * w;
  }
  CTR_CLONES
  static void Row(float* __restrict out, const float* __restrict s, const float* __restrict mean,
                  const float* __restrict r, const float* __restrict alpha, int64_t units) {
    for (int64_t j = 0; j < units; ++j) {
      const float p = 1.0f / (1.0f + Exp(-(s[j] - mean[j]) * r[j]));
      out[j] = s[j] * (alpha[j] + (1.0f - alpha[j]) * p);
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("CtrDice").Device(DEVICE_CPU), Dice);

class DiceGrad : public DiceKernel {
 public:
  using DiceKernel::DiceKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& g_t = ctx->input(0);
    const Tensor& s_t = ctx->input(1);
    const Tensor& mask_t = ctx->input(2);
    const Tensor& alpha_t = ctx->input(3);
    if (!CheckShapes(ctx, s_t, mask_t, alpha_t)) return;
    OP_REQUIRES(ctx, g_t.shape() == s_t.shape(), InvalidArgument("Dice: grad and s differ"));
    const int64_t rows = s_t.dim_size(0), units = s_t.dim_size(1);
    Tensor *ds_t = nullptr, *dalpha_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, s_t.shape(), &ds_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({units}), &dalpha_t));
    const float* g = g_t.flat<float>().data();
    const float* s = s_t.flat<float>().data();
    const float* mask = mask_t.flat<float>().data();
    const float* alpha = alpha_t.flat<float>().data();
    const float* mean = ctx->input(4).flat<float>().data();
    const float* var = ctx->input(5).flat<float>().data();
    std::vector<float> r(units), sums(4 * units);
    for (int64_t j = 0; j < units; ++j) r[j] = 1.0f / std::sqrt(var[j] + eps_);
    // Per unit: sum t, sum t (s - mean), sum mask (s - mean), dalpha.
    ColumnSums<4>(ctx, rows, units, [&](int64_t i, float* acc) {
      Sums(acc, g + i * units, s + i * units, mean, r.data(), alpha, mask[i], units);
    }, sums.data());
    float* dalpha = dalpha_t->flat<float>().data();
    std::memcpy(dalpha, sums.data() + 3 * units, units * sizeof(float));
    // Through the batch's mean and var: ds += mask (a + b (s - mean)).
    std::vector<float> a(units, 0.0f), b(units, 0.0f);
    const float n = training_ ? Count(mask, rows) : 0.0f;
    if (n != 0.0f) {
      for (int64_t j = 0; j < units; ++j) {
        const float dvar = -0.5f * r[j] * r[j] * r[j] * sums[units + j];
        const float dmean = -r[j] * sums[j] + dvar * (-2.0f * sums[2 * units + j] / n);
        a[j] = dmean / n;
        b[j] = 2.0f * dvar / n;
      }
    }
    float* ds = ds_t->flat<float>().data();
    ParallelRows(ctx, rows, units * 24, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        Row(ds + i * units, g + i * units, s + i * units, mean, r.data(), alpha, a.data(),
            b.data(), mask[i], units);
    });
  }

 private:
  CTR_CLONES
  static void Sums(float* __restrict acc, const float* __restrict g, const float* __restrict s,
                   const float* __restrict mean, const float* __restrict r,
                   const float* __restrict alpha, float w, int64_t units) {
    for (int64_t j = 0; j < units; ++j) {
      const float c = s[j] - mean[j];
      const float p = 1.0f / (1.0f + Exp(-c * r[j]));
      const float t = g[j] * s[j] * (1.0f - alpha[j]) * p * (1.0f - p);
      acc[j] += t;
      acc[units + j] += t * c;
      acc[2 * units + j] += w * c;
      acc[3 * units + j] += g[j] * s[j] * (1.0f - p);
    }
  }
  CTR_CLONES
  static void Row(float* __restrict ds, const float* __restrict g, const float* __restrict s,
                  const float* __restrict mean, const float* __restrict r,
                  const float* __restrict alpha, const float* __restrict a,
                  const float* __restrict b, float w, int64_t units) {
    for (int64_t j = 0; j < units; ++j) {
      const float c = s[j] - mean[j];
      const float p = 1.0f / (1.0f + Exp(-c * r[j]));
      ds[j] = g[j] * (alpha[j] + (1.0f - alpha[j]) * p)
              + g[j] * s[j] * (1.0f - alpha[j]) * p * (1.0f - p) * r[j]
              + w * (a[j] + b[j] * c);
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("CtrDiceGrad").Device(DEVICE_CPU), DiceGrad);

// ---------------------------------------------------------------------------------------------
// AutoInt's multi-head self-attention over the fields (models/blocks.py SelfAttention): per
// example and head, P = softmax(Q K^T) over the m fields and out = P V, with q, k, v [B, m,
// heads * size] as the projections give them. TensorFlow runs it as transposes, two batched
// matmuls of B x heads tiny [m, size] matrices, a softmax and their gradients. Here 16
// examples are computed side by side, one per vector lane (a head's [m, size] = [39, 8] is
// too small to fill vectors along its own axes), each group's blocks copied to lane-minor
// scratch first. P is kept for the gradient, in the groups' layout [B/16, heads, m, m, 16]:
//   dV = P^T dO,  dP = dO V^T,  dS = P (dP - rowsum(P dP)),  dQ = dS K,  dK = dS^T Q.

constexpr int64_t kLanes = 16;

int64_t LaneGroups(int64_t batch) { return (batch + kLanes - 1) / kLanes; }

REGISTER_OP("CtrFieldAttention")
    .Input("q: float")        // [B, m, heads * size]
    .Input("k: float")
    .Input("v: float")
    .Output("out: float")     // [B, m, heads * size]
    .Output("probs: float")   // [B/16 rounded up, heads, m, m, 16], for the gradient
    .Attr("heads: int")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle q;
      int heads;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &q));
      TF_RETURN_IF_ERROR(c->GetAttr("heads", &heads));
      c->set_output(0, q);
      c->set_output(1, c->MakeShape({c->UnknownDim(), heads, c->Dim(q, 1), c->Dim(q, 1),
                                     kLanes}));
      return absl::OkStatus();
    });

REGISTER_OP("CtrFieldAttentionGrad")
    .Input("d_out: float")
    .Input("q: float")
    .Input("k: float")
    .Input("v: float")
    .Input("probs: float")
    .Output("d_q: float")
    .Output("d_k: float")
    .Output("d_v: float")
    .Attr("heads: int")
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < 3; ++i) c->set_output(i, c->input(1));
      return absl::OkStatus();
    });

// A group's head block [m, size] of x (examples b0.. b0 + lanes, rows `width` apart, the head
// at column h0) to lane-minor scratch [m][size][16], zeros in the lanes past the batch; and back.
void ToLanes(const float* x, int64_t b0, int64_t lanes, int64_t m, int64_t width, int64_t h0,
             int64_t size, float* out) {
  std::fill(out, out + m * size * kLanes, 0.0f);
  for (int64_t l = 0; l < lanes; ++l) {
    const float* src = x + (b0 + l) * m * width + h0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < size; ++c) out[(i * size + c) * kLanes + l] = src[i * width + c];
  }
}

void FromLanes(const float* in, int64_t b0, int64_t lanes, int64_t m, int64_t width, int64_t h0,
               int64_t size, float* x) {
  for (int64_t l = 0; l < lanes; ++l) {
    float* dst = x + (b0 + l) * m * width + h0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < size; ++c) dst[i * width + c] = in[(i * size + c) * kLanes + l];
  }
}

// One group's head, lane-minor: Q, K, V, O [m][size][16], P [m][m][16].
CTR_CLONES
void AttendLanes(const float* __restrict Q, const float* __restrict K, const float* __restrict V,
                 float* __restrict O, float* __restrict P, int64_t m, int64_t size) {
  for (int64_t i = 0; i < m; ++i) {
    float* row = P + i * m * kLanes;
    float top[kLanes], total[kLanes];
    for (int64_t l = 0; l < kLanes; ++l) top[l] = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < m; ++j) {
      float s[kLanes] = {};
      for (int64_t c = 0; c < size; ++c) {
        const float* qc = Q + (i * size + c) * kLanes;
        const float* kc = K + (j * size + c) * kLanes;
        for (int64_t l = 0; l < kLanes; ++l) s[l] += qc[l] * kc[l];
      }
      for (int64_t l = 0; l < kLanes; ++l) {
        row[j * kLanes + l] = s[l];
        top[l] = std::max(top[l], s[l]);
      }
    }
    for (int64_t l = 0; l < kLanes; ++l) total[l] = 0.0f;
    for (int64_t j = 0; j < m; ++j) {
      for (int64_t l = 0; l < kLanes; ++l) {
        const float e = Exp(row[j * kLanes + l] - top[l]);
        row[j * kLanes + l] = e;
        total[l] += e;
      }
    }
    for (int64_t l = 0; l < kLanes; ++l) total[l] = 1.0f / total[l];
    float* o = O + i * size * kLanes;
    std::fill(o, o + size * kLanes, 0.0f);
    for (int64_t j = 0; j < m; ++j) {
      float* pj = row + j * kLanes;
      for (int64_t l = 0; l < kLanes; ++l) pj[l] *= total[l];
      for (int64_t c = 0; c < size; ++c) {
        const float* vc = V + (j * size + c) * kLanes;
        float* oc = o + c * kLanes;
        for (int64_t l = 0; l < kLanes; ++l) oc[l] += pj[l] * vc[l];
      }
    }
  }
}

// Its gradient: dO, Q, K, V, P as above; dQ, dK, dV [m][size][16] written; dS scratch [m][16].
CTR_CLONES
void AttendLanesGrad(const float* __restrict dO, const float* __restrict Q,
                     const float* __restrict K, const float* __restrict V,
                     const float* __restrict P, float* __restrict dQ, float* __restrict dK,
                     float* __restrict dV, float* __restrict dS, int64_t m, int64_t size) {
  std::fill(dQ, dQ + m * size * kLanes, 0.0f);
  std::fill(dK, dK + m * size * kLanes, 0.0f);
  std::fill(dV, dV + m * size * kLanes, 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    const float* row = P + i * m * kLanes;
    float weighted[kLanes] = {};
    for (int64_t j = 0; j < m; ++j) {             // dP_ij = dO_i . V_j
      float d[kLanes] = {};
      for (int64_t c = 0; c < size; ++c) {
        const float* oc = dO + (i * size + c) * kLanes;
        const float* vc = V + (j * size + c) * kLanes;
        for (int64_t l = 0; l < kLanes; ++l) d[l] += oc[l] * vc[l];
      }
      for (int64_t l = 0; l < kLanes; ++l) {
        dS[j * kLanes + l] = d[l];
        weighted[l] += row[j * kLanes + l] * d[l];
      }
    }
    for (int64_t j = 0; j < m; ++j) {
      const float* pj = row + j * kLanes;
      float* sj = dS + j * kLanes;
      for (int64_t l = 0; l < kLanes; ++l) sj[l] = pj[l] * (sj[l] - weighted[l]);
      for (int64_t c = 0; c < size; ++c) {
        const int64_t ic = (i * size + c) * kLanes, jc = (j * size + c) * kLanes;
        for (int64_t l = 0; l < kLanes; ++l) {
          dQ[ic + l] += sj[l] * K[jc + l];
          dK[jc + l] += sj[l] * Q[ic + l];
          dV[jc + l] += pj[l] * dO[ic + l];
        }
      }
    }
  }
}

class FieldAttentionKernel : public OpKernel {
 public:
  explicit FieldAttentionKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("heads", &heads_));
  }

 protected:
  // q, k and v (from `first` on) all [B, m, heads * size] with heads dividing the last.
  bool CheckShapes(OpKernelContext* ctx, int first) {
    const Tensor& q = ctx->input(first);
    if (q.dims() != 3 || heads_ <= 0 || q.dim_size(2) % heads_ != 0) {
      ctx->SetStatus(InvalidArgument("field attention: q is ", q.shape().DebugString(),
                                     ", not [B, m, heads * size] for ", heads_, " heads"));
      return false;
    }
    for (int i = first + 1; i < first + 3; ++i) {
      if (ctx->input(i).shape() != q.shape()) {
        ctx->SetStatus(InvalidArgument("field attention: q is ", q.shape().DebugString(),
                                       ", input ", i, " ", ctx->input(i).shape().DebugString()));
        return false;
      }
    }
    return true;
  }

  int heads_;
};

class FieldAttention : public FieldAttentionKernel {
 public:
  using FieldAttentionKernel::FieldAttentionKernel;

  void Compute(OpKernelContext* ctx) override {
    if (!CheckShapes(ctx, 0)) return;
    const Tensor& q_t = ctx->input(0);
    const int64_t batch = q_t.dim_size(0), m = q_t.dim_size(1), width = q_t.dim_size(2);
    const int64_t heads = heads_, size = width / heads, groups = LaneGroups(batch);
    Tensor *out_t = nullptr, *probs_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, q_t.shape(), &out_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({groups, heads, m, m, kLanes}),
                                             &probs_t));
    const float* q = q_t.flat<float>().data();
    const float* k = ctx->input(1).flat<float>().data();
    const float* v = ctx->input(2).flat<float>().data();
    float* out = out_t->flat<float>().data();
    float* probs = probs_t->flat<float>().data();
    const int64_t block = m * size * kLanes;
    ParallelRows(ctx, groups, 4 * kLanes * heads * m * m * size, [&](int64_t lo, int64_t hi) {
      std::vector<float> scratch(4 * block);
      float *Q = scratch.data(), *K = Q + block, *V = K + block, *O = V + block;
      for (int64_t g = lo; g < hi; ++g) {
        const int64_t b0 = g * kLanes, lanes = std::min(kLanes, batch - b0);
        for (int64_t h = 0; h < heads; ++h) {
          ToLanes(q, b0, lanes, m, width, h * size, size, Q);
          ToLanes(k, b0, lanes, m, width, h * size, size, K);
          ToLanes(v, b0, lanes, m, width, h * size, size, V);
          AttendLanes(Q, K, V, O, probs + (g * heads + h) * m * m * kLanes, m, size);
          FromLanes(O, b0, lanes, m, width, h * size, size, out);
        }
      }
    });
  }
};

REGISTER_KERNEL_BUILDER(Name("CtrFieldAttention").Device(DEVICE_CPU), FieldAttention);

class FieldAttentionGrad : public FieldAttentionKernel {
 public:
  using FieldAttentionKernel::FieldAttentionKernel;

  void Compute(OpKernelContext* ctx) override {
    if (!CheckShapes(ctx, 1)) return;
    const Tensor& q_t = ctx->input(1);
    OP_REQUIRES(ctx, ctx->input(0).shape() == q_t.shape(),
                InvalidArgument("field attention: d_out and q differ in shape"));
    const int64_t batch = q_t.dim_size(0), m = q_t.dim_size(1), width = q_t.dim_size(2);
    const int64_t heads = heads_, size = width / heads, groups = LaneGroups(batch);
    OP_REQUIRES(ctx, ctx->input(4).NumElements() == groups * heads * m * m * kLanes,
                InvalidArgument("field attention: probs has ", ctx->input(4).NumElements(),
                                " elements"));
    Tensor *dq_t = nullptr, *dk_t = nullptr, *dv_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, q_t.shape(), &dq_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, q_t.shape(), &dk_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, q_t.shape(), &dv_t));
    const float* d_out = ctx->input(0).flat<float>().data();
    const float* q = q_t.flat<float>().data();
    const float* k = ctx->input(2).flat<float>().data();
    const float* v = ctx->input(3).flat<float>().data();
    const float* probs = ctx->input(4).flat<float>().data();
    float* dq = dq_t->flat<float>().data();
    float* dk = dk_t->flat<float>().data();
    float* dv = dv_t->flat<float>().data();
    const int64_t block = m * size * kLanes;
    ParallelRows(ctx, groups, 8 * kLanes * heads * m * m * size, [&](int64_t lo, int64_t hi) {
      std::vector<float> scratch(7 * block + m * kLanes);
      float *dO = scratch.data(), *Q = dO + block, *K = Q + block, *V = K + block;
      float *dQ = V + block, *dK = dQ + block, *dV = dK + block, *dS = dV + block;
      for (int64_t g = lo; g < hi; ++g) {
        const int64_t b0 = g * kLanes, lanes = std::min(kLanes, batch - b0);
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t h0 = h * size;
          ToLanes(d_out, b0, lanes, m, width, h0, size, dO);
          ToLanes(q, b0, lanes, m, width, h0, size, Q);
          ToLanes(k, b0, lanes, m, width, h0, size, K);
          ToLanes(v, b0, lanes, m, width, h0, size, V);
          AttendLanesGrad(dO, Q, K, V, probs + (g * heads + h) * m * m * kLanes, dQ, dK, dV,
                          dS, m, size);
          FromLanes(dQ, b0, lanes, m, width, h0, size, dq);
          FromLanes(dK, b0, lanes, m, width, h0, size, dk);
          FromLanes(dV, b0, lanes, m, width, h0, size, dv);
        }
      }
    });
  }
};

REGISTER_KERNEL_BUILDER(Name("CtrFieldAttentionGrad").Device(DEVICE_CPU), FieldAttentionGrad);

// ---------------------------------------------------------------------------------------------
// Dropout: out = x / (1 - rate) where kept, 0 elsewhere, each element kept with probability
// 1 - rate, its draw a function of (seed, its index) alone. So the gradient is this same op on
// the incoming gradient with the same seed (the mask is drawn again, not stored), and one pass
// does what tf.nn.dropout does in four ops (RandomUniform, GreaterEqual, Mul, Select).
//
// The draws come from SplitMix64 (Steele, Lea and Flood, 2014; passes BigCrush) over the
// element's index, 16 bits per element (4 elements per 64-bit output): TensorFlow's Philox
// makes a 32-bit float per element, and at the reference configuration that made dropout's
// random numbers a fifth of the step's CPU time (docs/benchmarks.md). With 16 bits the rate is
// held to the nearest 1/65536 (0.5 exactly); the scale is 1 / (1 - rate), as TensorFlow's.

// The "rate" attribute of the dropout ops, refused outside [0, 1) (one rule for both).
absl::Status DropoutRate(OpKernelConstruction* ctx, float* rate) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("rate", rate));
  if (!(*rate >= 0.0f && *rate < 1.0f)) {
    return InvalidArgument("dropout rate ", *rate, " is outside [0, 1)");
  }
  return absl::OkStatus();
}

REGISTER_OP("CtrDropout")
    .Input("x: float")
    .Input("seed: int64")     // [2]: a new pair per step (the caller draws it)
    .Output("out: float")
    .Attr("rate: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle seed;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &seed));
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    });

class Dropout : public OpKernel {
 public:
  explicit Dropout(OpKernelConstruction* ctx) : OpKernel(ctx) {
    float rate;
    OP_REQUIRES_OK(ctx, DropoutRate(ctx, &rate));
    threshold_ = static_cast<uint32_t>(std::lround(static_cast<double>(rate) * 65536.0));
    scale_ = 1.0f / (1.0f - rate);
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x_t = ctx->input(0);
    const Tensor& seed_t = ctx->input(1);
    OP_REQUIRES(ctx, seed_t.NumElements() == 2,
                InvalidArgument("seed has ", seed_t.NumElements(), " elements, not 2"));
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x_t.shape(), &out_t));
    const auto seed = seed_t.flat<int64_t>();
    const uint64_t key = Mix(static_cast<uint64_t>(seed(0)) ^ Mix(static_cast<uint64_t>(seed(1))));
    const float* x = x_t.flat<float>().data();
    float* out = out_t->flat<float>().data();
    const int64_t n = x_t.NumElements();
    const int64_t full = n / 4;
    ParallelRows(ctx, full, 24, [&](int64_t lo, int64_t hi) {
      Groups(x, out, lo, hi, key, threshold_, scale_);
    });
    for (int64_t i = 4 * full; i < n; ++i) {   // the last few elements, one at a time
      const uint64_t bits = Mix(key + static_cast<uint64_t>(full + 1) * kGolden) >> (16 * (i % 4));
      out[i] = x[i] * (static_cast<float>((bits & 0xffff) >= threshold_) * scale_);
    }
  }

 private:
  static constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

  // SplitMix64's output function.
  static inline uint64_t Mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  // Groups [lo, hi) of 4 elements. Arithmetic, not a branch (a branch on a random bit
  // mispredicts half the time: 3.7 against 0.6 ns an element), and four elements per group
  // so that the compiler vectorizes the groups; compiled also for AVX2 and AVX-512 (their
  // 64-bit multiplies), picked at load time: 0.26 ns an element on AVX-512.
  CTR_CLONES
  static void Groups(const float* __restrict x, float* __restrict out, int64_t lo, int64_t hi,
                     uint64_t key, uint32_t threshold, float scale) {
    for (int64_t g = lo; g < hi; ++g) {
      const uint64_t bits = Mix(key + static_cast<uint64_t>(g + 1) * kGolden);
      for (int j = 0; j < 4; ++j) {
        const uint32_t draw = static_cast<uint32_t>(bits >> (16 * j)) & 0xffff;
        out[4 * g + j] = x[4 * g + j] * (static_cast<float>(draw >= threshold) * scale);
      }
    }
  }

  uint32_t threshold_;
  float scale_;
};

REGISTER_KERNEL_BUILDER(Name("CtrDropout").Device(DEVICE_CPU), Dropout);

// ---------------------------------------------------------------------------------------------
// An MLP layer y = dropout(relu(z + b)) (dropout's scale 1 / (1 - rate), rate 0: none) back to
// z and b from the gradient dy and the output y alone: y > 0 exactly where the element was
// kept and z + b > 0, so dz = dy / (1 - rate) there and 0 elsewhere, and db = sum over the
// batch of dz. TensorFlow's backward of the same layer is three ops, each a pass over the
// [B, n] gradient (dropout's gradient, ReluGrad, the bias's column Sum, which Eigen reduces
// slowly across rows); this is one. The rows go to the threads in a fixed number of chunks,
// each summing its rows into its own partial sums, added in chunk order: contiguous passes
// (column blocks strided over the rows were 2.6x slower than a plain element-wise op), and
// the same sums for any number of threads.

REGISTER_OP("CtrReluDropoutGrad")
    .Input("dy: float")      // [B, n]
    .Input("y: float")       // [B, n] the layer's output
    .Output("dz: float")     // [B, n]
    .Output("db: float")     // [n]
    .Attr("rate: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle dy;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &dy));
      c->set_output(0, dy);
      c->set_output(1, c->Vector(c->Dim(dy, 1)));
      return absl::OkStatus();
    });

class ReluDropoutGrad : public OpKernel {
 public:
  explicit ReluDropoutGrad(OpKernelConstruction* ctx) : OpKernel(ctx) {
    float rate;
    OP_REQUIRES_OK(ctx, DropoutRate(ctx, &rate));
    scale_ = 1.0f / (1.0f - rate);
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& dy_t = ctx->input(0);
    const Tensor& y_t = ctx->input(1);
    OP_REQUIRES(ctx, dy_t.dims() == 2 && dy_t.shape() == y_t.shape(),
                InvalidArgument("dy ", dy_t.shape().DebugString(), " and y ",
                                y_t.shape().DebugString(), " must be the same [B, n]"));
    const int64_t rows = dy_t.dim_size(0), n = dy_t.dim_size(1);
    Tensor *dz_t = nullptr, *db_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, dy_t.shape(), &dz_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &db_t));
    const float* dy = dy_t.flat<float>().data();
    const float* y = y_t.flat<float>().data();
    float* dz = dz_t->flat<float>().data();
    float* db = db_t->flat<float>().data();
    const int64_t chunks = std::max<int64_t>(1, std::min(kChunks, rows));
    std::vector<float> partial(chunks * n, 0.0f);
    ParallelRows(ctx, chunks, (rows / chunks + 1) * n * 4, [&](int64_t lo, int64_t hi) {
      for (int64_t k = lo; k < hi; ++k) {
        const int64_t r0 = rows * k / chunks, r1 = rows * (k + 1) / chunks;
        Rows(dy + r0 * n, y + r0 * n, dz + r0 * n, partial.data() + k * n, r1 - r0, n, scale_);
      }
    });
    std::fill(db, db + n, 0.0f);
    for (int64_t k = 0; k < chunks; ++k) {
      const float* part = partial.data() + k * n;
      for (int64_t c = 0; c < n; ++c) db[c] += part[c];
    }
  }

 private:
  static constexpr int64_t kChunks = 16;

  // Rows [0, rows) of the chunk, each a contiguous pass; sums into `sum` [n].
  CTR_CLONES
  static void Rows(const float* __restrict dy, const float* __restrict y, float* __restrict dz,
                   float* __restrict sum, int64_t rows, int64_t n, float scale) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* g = dy + r * n;
      const float* out = y + r * n;
      float* d = dz + r * n;
      for (int64_t c = 0; c < n; ++c) {
        const float v = out[c] > 0.0f ? g[c] * scale : 0.0f;
        d[c] = v;
        sum[c] += v;
      }
    }
  }

  float scale_;
};

REGISTER_KERNEL_BUILDER(Name("CtrReluDropoutGrad").Device(DEVICE_CPU), ReluDropoutGrad);

// ---------------------------------------------------------------------------------------------
// xDeepFM's CIN (models/blocks.py CIN): each layer multiplies every field by every map of the
// previous layer, row by row (a row: one example's one embedding dimension), then one matmul.
// TensorFlow's broadcast Mul writes the [R, A B] products at a third of a copy's speed, and its
// gradient is two Muls that write [R, A B] each and two Sums that read them back (together a
// quarter of xDeepFM's step); these write the products once and read their gradient once, and
// sum in float32 for bfloat16 too:
//   CtrOuterProduct      z[r, i B + j] = a[r, i] b[r, j]
//   CtrOuterProductGrad  da[r, i] = sum_j g[r, i B + j] b[r, j],  db[r, j] = sum_i g[r, i B + j] a[r, i]
// The loops run over j: the CIN gives b its maps (H = 128, whole vectors), a the fields.

REGISTER_OP("CtrOuterProduct")
    .Input("a: T")          // [R, A]
    .Input("b: T")          // [R, B]
    .Output("z: T")         // [R, A B]
    .Attr("T: {float, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle a, b;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &a));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &b));
      tensorflow::shape_inference::DimensionHandle width;
      TF_RETURN_IF_ERROR(c->Multiply(c->Dim(a, 1), c->Dim(b, 1), &width));
      c->set_output(0, c->Matrix(c->Dim(a, 0), width));
      return absl::OkStatus();
    });

REGISTER_OP("CtrOuterProductGrad")
    .Input("grad: T")       // [R, A B]
    .Input("a: T")          // [R, A]
    .Input("b: T")          // [R, B]
    .Output("da: T")        // [R, A]
    .Output("db: T")        // [R, B]
    .Attr("T: {float, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(1));
      c->set_output(1, c->input(2));
      return absl::OkStatus();
    });

// bfloat16 is the upper half of a float32: widening is a shift, narrowing rounds to nearest
// even (NaN kept a NaN), as Eigen's conversion; on raw 16-bit words so that the loops vectorize.
inline float Widen(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float Widen(float f) { return f; }

inline uint16_t NarrowBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline void Store(float* dst, float v) { *dst = v; }
inline void Store(uint16_t* dst, float v) { *dst = NarrowBf16(v); }

// Rows [0, rows) of a [rows, A] and b [rows, B]; `fb` [B] float32 scratch.
template <typename E>
inline __attribute__((always_inline)) void OuterRows(const E* __restrict a, const E* __restrict b,
                                                     E* __restrict z, float* __restrict fb,
                                                     int64_t rows, int64_t na, int64_t nb) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < nb; ++j) fb[j] = Widen(b[r * nb + j]);
    E* out = z + r * na * nb;
    for (int64_t i = 0; i < na; ++i) {
      const float ai = Widen(a[r * na + i]);
      for (int64_t j = 0; j < nb; ++j) Store(out + i * nb + j, ai * fb[j]);
    }
  }
}

// `acc` [B] float32 scratch for db's sums, `fb` [B] for b widened.
template <typename E>
inline __attribute__((always_inline)) void OuterGradRows(
    const E* __restrict g, const E* __restrict a, const E* __restrict b, E* __restrict da,
    E* __restrict db, float* __restrict acc, float* __restrict fb, int64_t rows, int64_t na,
    int64_t nb) {
  for (int64_t r = 0; r < rows; ++r) {
    const E* gr = g + r * na * nb;
    for (int64_t j = 0; j < nb; ++j) {
      fb[j] = Widen(b[r * nb + j]);
      acc[j] = 0.0f;
    }
    for (int64_t i = 0; i < na; ++i) {
      const E* gi = gr + i * nb;
      const float ai = Widen(a[r * na + i]);
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < nb; ++j) {
        const float v = Widen(gi[j]);
        dot += v * fb[j];
        acc[j] += v * ai;
      }
      Store(da + r * na + i, dot);
    }
    for (int64_t j = 0; j < nb; ++j) Store(db + r * nb + j, acc[j]);
  }
}

// Each element type compiled for each CPU (an overload per type: the op's template picks it).
CTR_CLONES
void Outer(const float* a, const float* b, float* z, float* fb, int64_t rows, int64_t na,
           int64_t nb) {
  OuterRows(a, b, z, fb, rows, na, nb);
}
CTR_CLONES
void Outer(const uint16_t* a, const uint16_t* b, uint16_t* z, float* fb, int64_t rows,
           int64_t na, int64_t nb) {
  OuterRows(a, b, z, fb, rows, na, nb);
}
CTR_CLONES
void OuterGrad(const float* g, const float* a, const float* b, float* da, float* db, float* acc,
               float* fb, int64_t rows, int64_t na, int64_t nb) {
  OuterGradRows(g, a, b, da, db, acc, fb, rows, na, nb);
}
CTR_CLONES
void OuterGrad(const uint16_t* g, const uint16_t* a, const uint16_t* b, uint16_t* da,
               uint16_t* db, float* acc, float* fb, int64_t rows, int64_t na, int64_t nb) {
  OuterGradRows(g, a, b, da, db, acc, fb, rows, na, nb);
}

// a [R, A] and b [R, B] with the same R, else an error naming both.
bool CheckFactors(OpKernelContext* ctx, const Tensor& a, const Tensor& b) {
  if (a.dims() == 2 && b.dims() == 2 && a.dim_size(0) == b.dim_size(0)) return true;
  ctx->SetStatus(InvalidArgument("a ", a.shape().DebugString(), " and b ",
                                 b.shape().DebugString(), " must be matrices of the same rows"));
  return false;
}

template <typename T, typename E>
class OuterProduct : public OpKernel {
 public:
  explicit OuterProduct(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& a = ctx->input(0);
    const Tensor& b = ctx->input(1);
    if (!CheckFactors(ctx, a, b)) return;
    const int64_t rows = a.dim_size(0), na = a.dim_size(1), nb = b.dim_size(1);
    Tensor* z = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({rows, na * nb}), &z));
    const E* as = reinterpret_cast<const E*>(a.flat<T>().data());
    const E* bs = reinterpret_cast<const E*>(b.flat<T>().data());
    E* zs = reinterpret_cast<E*>(z->flat<T>().data());
    ParallelRows(ctx, rows, 2 * na * nb, [&](int64_t lo, int64_t hi) {
      std::vector<float> fb(nb);
      Outer(as + lo * na, bs + lo * nb, zs + lo * na * nb, fb.data(), hi - lo, na, nb);
    });
  }
};

template <typename T, typename E>
class OuterProductGrad : public OpKernel {
 public:
  explicit OuterProductGrad(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad = ctx->input(0);
    const Tensor& a = ctx->input(1);
    const Tensor& b = ctx->input(2);
    if (!CheckFactors(ctx, a, b)) return;
    const int64_t rows = a.dim_size(0), na = a.dim_size(1), nb = b.dim_size(1);
    OP_REQUIRES(ctx, grad.dims() == 2 && grad.dim_size(0) == rows &&
                         grad.dim_size(1) == na * nb,
                InvalidArgument("grad ", grad.shape().DebugString(), " is not [R, A B] for a ",
                                a.shape().DebugString(), " and b ", b.shape().DebugString()));
    Tensor *da = nullptr, *db = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, a.shape(), &da));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, b.shape(), &db));
    const E* g = reinterpret_cast<const E*>(grad.flat<T>().data());
    const E* as = reinterpret_cast<const E*>(a.flat<T>().data());
    const E* bs = reinterpret_cast<const E*>(b.flat<T>().data());
    E* das = reinterpret_cast<E*>(da->flat<T>().data());
    E* dbs = reinterpret_cast<E*>(db->flat<T>().data());
    ParallelRows(ctx, rows, 4 * na * nb, [&](int64_t lo, int64_t hi) {
      std::vector<float> scratch(2 * nb);
      OuterGrad(g + lo * na * nb, as + lo * na, bs + lo * nb, das + lo * na, dbs + lo * nb,
                scratch.data(), scratch.data() + nb, hi - lo, na, nb);
    });
  }
};

REGISTER_KERNEL_BUILDER(Name("CtrOuterProduct").Device(DEVICE_CPU).TypeConstraint<float>("T"),
                        (OuterProduct<float, float>));
REGISTER_KERNEL_BUILDER(
    Name("CtrOuterProduct").Device(DEVICE_CPU).TypeConstraint<tensorflow::bfloat16>("T"),
    (OuterProduct<tensorflow::bfloat16, uint16_t>));
REGISTER_KERNEL_BUILDER(Name("CtrOuterProductGrad").Device(DEVICE_CPU).TypeConstraint<float>("T"),
                        (OuterProductGrad<float, float>));
REGISTER_KERNEL_BUILDER(
    Name("CtrOuterProductGrad").Device(DEVICE_CPU).TypeConstraint<tensorflow::bfloat16>("T"),
    (OuterProductGrad<tensorflow::bfloat16, uint16_t>));

// The CIN's first layer multiplies the fields by themselves: x_i x_j = x_j x_i, so the m^2
// products hold m (m + 1) / 2 distinct values, and a matmul over those (with the weights of
// (i, j) and (j, i) added, blocks.py) does half the first layer's arithmetic.
//   CtrPairProduct      z[r, p(i, j)] = x[r, i] x[r, j] for i <= j, p row-major over (i, j)
//   CtrPairProductGrad  dx[r, a] = sum over the pairs holding a of grad times the other factor
//                       (the diagonal's x_a^2 twice: 2 grad x_a)

REGISTER_OP("CtrPairProduct")
    .Input("x: T")          // [R, M]
    .Output("z: T")         // [R, M (M + 1) / 2]
    .Attr("T: {float, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
      const int64_t m = c->Value(c->Dim(x, 1));
      c->set_output(0, c->Matrix(c->Dim(x, 0),
                                 m < 0 ? c->UnknownDim() : c->MakeDim(m * (m + 1) / 2)));
      return absl::OkStatus();
    });

REGISTER_OP("CtrPairProductGrad")
    .Input("grad: T")       // [R, M (M + 1) / 2]
    .Input("x: T")          // [R, M]
    .Output("dx: T")        // [R, M]
    .Attr("T: {float, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(1));
      return absl::OkStatus();
    });

template <typename E>
inline __attribute__((always_inline)) void PairRows(const E* __restrict x, E* __restrict z,
                                                    float* __restrict f, int64_t rows,
                                                    int64_t m) {
  const int64_t pairs = m * (m + 1) / 2;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < m; ++j) f[j] = Widen(x[r * m + j]);
    E* out = z + r * pairs;
    for (int64_t i = 0; i < m; ++i) {
      const float xi = f[i];
      for (int64_t j = i; j < m; ++j) Store(out + j - i, xi * f[j]);
      out += m - i;
    }
  }
}

template <typename E>
inline __attribute__((always_inline)) void PairGradRows(const E* __restrict g,
                                                        const E* __restrict x, E* __restrict dx,
                                                        float* __restrict acc,
                                                        float* __restrict f, int64_t rows,
                                                        int64_t m) {
  const int64_t pairs = m * (m + 1) / 2;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < m; ++j) {
      f[j] = Widen(x[r * m + j]);
      acc[j] = 0.0f;
    }
    const E* gr = g + r * pairs;
    for (int64_t i = 0; i < m; ++i) {
      const float xi = f[i];
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = i; j < m; ++j) {
        const float v = Widen(gr[j - i]);
        dot += v * f[j];
        acc[j] += v * xi;
      }
      acc[i] += dot;
      gr += m - i;
    }
    for (int64_t j = 0; j < m; ++j) Store(dx + r * m + j, acc[j]);
  }
}

CTR_CLONES
void Pairs(const float* x, float* z, float* f, int64_t rows, int64_t m) {
  PairRows(x, z, f, rows, m);
}
CTR_CLONES
void Pairs(const uint16_t* x, uint16_t* z, float* f, int64_t rows, int64_t m) {
  PairRows(x, z, f, rows, m);
}
CTR_CLONES
void PairsGrad(const float* g, const float* x, float* dx, float* acc, float* f, int64_t rows,
               int64_t m) {
  PairGradRows(g, x, dx, acc, f, rows, m);
}
CTR_CLONES
void PairsGrad(const uint16_t* g, const uint16_t* x, uint16_t* dx, float* acc, float* f,
               int64_t rows, int64_t m) {
  PairGradRows(g, x, dx, acc, f, rows, m);
}

template <typename T, typename E>
class PairProduct : public OpKernel {
 public:
  explicit PairProduct(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    OP_REQUIRES(ctx, x.dims() == 2, InvalidArgument("x must be a matrix"));
    const int64_t rows = x.dim_size(0), m = x.dim_size(1), pairs = m * (m + 1) / 2;
    Tensor* z = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({rows, pairs}), &z));
    const E* xs = reinterpret_cast<const E*>(x.flat<T>().data());
    E* zs = reinterpret_cast<E*>(z->flat<T>().data());
    ParallelRows(ctx, rows, 2 * pairs, [&](int64_t lo, int64_t hi) {
      std::vector<float> f(m);
      Pairs(xs + lo * m, zs + lo * pairs, f.data(), hi - lo, m);
    });
  }
};

template <typename T, typename E>
class PairProductGrad : public OpKernel {
 public:
  explicit PairProductGrad(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad = ctx->input(0);
    const Tensor& x = ctx->input(1);
    OP_REQUIRES(ctx, grad.dims() == 2 && x.dims() == 2,
                InvalidArgument("grad and x must be matrices"));
    const int64_t rows = x.dim_size(0), m = x.dim_size(1), pairs = m * (m + 1) / 2;
    OP_REQUIRES(ctx, grad.dim_size(0) == rows && grad.dim_size(1) == pairs,
                InvalidArgument("grad ", grad.shape().DebugString(), " is not [R, M (M + 1) / 2]",
                                " for x ", x.shape().DebugString()));
    Tensor* dx = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &dx));
    const E* g = reinterpret_cast<const E*>(grad.flat<T>().data());
    const E* xs = reinterpret_cast<const E*>(x.flat<T>().data());
    E* dxs = reinterpret_cast<E*>(dx->flat<T>().data());
    ParallelRows(ctx, rows, 4 * pairs, [&](int64_t lo, int64_t hi) {
      std::vector<float> scratch(2 * m);
      PairsGrad(g + lo * pairs, xs + lo * m, dxs + lo * m, scratch.data(), scratch.data() + m,
                hi - lo, m);
    });
  }
};

REGISTER_KERNEL_BUILDER(Name("CtrPairProduct").Device(DEVICE_CPU).TypeConstraint<float>("T"),
                        (PairProduct<float, float>));
REGISTER_KERNEL_BUILDER(
    Name("CtrPairProduct").Device(DEVICE_CPU).TypeConstraint<tensorflow::bfloat16>("T"),
    (PairProduct<tensorflow::bfloat16, uint16_t>));
REGISTER_KERNEL_BUILDER(
    Name("CtrPairProductGrad").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    (PairProductGrad<float, float>));
REGISTER_KERNEL_BUILDER(
    Name("CtrPairProductGrad").Device(DEVICE_CPU).TypeConstraint<tensorflow::bfloat16>("T"),
    (PairProductGrad<tensorflow::bfloat16, uint16_t>));

}  // namespace ctrtrain
