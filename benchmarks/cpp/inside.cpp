// Careful CPU baseline for the inside algorithm (forward log Z only).
//
// Layout is chosen so the O(n^3) bifurcation loop reads two contiguous arrays:
//   P  row-major   P[i*(n+1) + k]   -> P[i][k] for k = i+h+1 .. j-1 is contiguous
//   Zt transposed  Zt[j*(n+1) + i]  =  Z[i][j] -> Z[k+1][j] is contiguous in k
// Cells are filled for i = n-1 .. 0 and j = i .. n-1, so row i of P and row j of Zt
// are complete for every k the split loop touches.
// The split loop is a max pass and then an exp-sum pass, both `omp simd` reductions
// (float reductions are not vectorised by GCC without that, and we avoid
// -ffast-math so that -inf keeps its IEEE meaning). exp is a branch-free
// polynomial so that it vectorises; its error is ~1 ulp for float and ~1e-15 for
// double, far below the float32 summation error over n terms.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

namespace {

template <class T> struct ExpTraits;
template <> struct ExpTraits<float> {
  using U = uint32_t;
  static constexpr float shift = 0x1.8p23f;  // adding it rounds to an integer kept in the low bits
  static constexpr float lo = -80.0f, hi = 88.0f;
  static constexpr int mant = 23, bias = 127, degree = 7;
};
template <> struct ExpTraits<double> {
  using U = uint64_t;
  static constexpr double shift = 0x1.8p52;
  static constexpr double lo = -700.0, hi = 709.0;
  static constexpr int mant = 52, bias = 1023, degree = 12;
};

// Taylor coefficients 1/d!, d = 0..D, computed at compile time.
template <class T, int D> constexpr std::array<T, D + 1> inv_factorials() {
  std::array<T, D + 1> c{};
  double f = 1;
  for (int d = 0; d <= D; ++d) { if (d) f *= d; c[d] = T(1 / f); }
  return c;
}

// exp(x) = 2^k * exp(r), r = x - k ln2 in [-ln2/2, ln2/2], Taylor polynomial for exp(r).
// Inputs below `lo` (including -inf) give ~2e-35 / 1e-304 instead of 0: harmless
// next to the max term, which contributes exactly 1 to the sum, and it keeps 2^k a
// normal number (denormal results would stall the loop).
template <class T>
inline T fast_exp(T x) {
  using E = ExpTraits<T>;
  using U = typename E::U;
  x = x < T(E::lo) ? T(E::lo) : x;
  x = x > T(E::hi) ? T(E::hi) : x;
  T kd = x * T(1.4426950408889634) + E::shift;
  U ki;
  std::memcpy(&ki, &kd, sizeof ki);
  kd -= E::shift;
  T r = x - kd * T(0.693145751953125) - kd * T(1.42860682030941723212e-6);  // ln2 hi + lo
  static constexpr auto c = inv_factorials<T, E::degree>();
  T p = c[E::degree];
  for (int d = E::degree - 1; d >= 0; --d) p = p * r + c[d];  // Horner, unrolled at -O3
  U bits = (ki + U(E::bias)) << E::mant;
  T scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

template <class T> inline T logaddexp(T a, T b) {
  T m = std::max(a, b);
  if (m == -std::numeric_limits<T>::infinity()) return m;
  // log, not log1p: glibc's log1pf costs more than the whole split loop at n=100,
  // and the absolute error (~1 ulp of 1) is far below that of m.
  return m + std::log(T(1) + std::exp(-std::abs(a - b)));
}

// log(exp(init) + sum_k exp(a[k] + b[k])): a max pass, then an exp-sum pass.
// noinline: inlined into `inside`, GCC 12 keeps the clamps as branches and leaves
// both loops scalar (~5 ns/term instead of ~1).
template <class T>
__attribute__((noinline)) T split_lse(T init, const T* __restrict a, const T* __restrict b, int len) {
  const T neg = -std::numeric_limits<T>::infinity();
  T m = init;
#pragma omp simd reduction(max : m)
  for (int k = 0; k < len; ++k) {
    T v = a[k] + b[k];
    m = v > m ? v : m;
  }
  if (m == neg) return neg;
  T s = fast_exp(init - m);
#pragma omp simd reduction(+ : s)
  for (int k = 0; k < len; ++k) s += fast_exp(a[k] + b[k] - m);
  return m + std::log(s);
}

template <class T>
T inside(const T* stack, const T* pair, const T* unpaired, T loop, const T* phi,
         const int32_t* x, int n, int h) {
  if (n <= 0) return T(0);
  const T neg = -std::numeric_limits<T>::infinity();
  const int w = n + 1;
  // Z = Zn = 0 on empty spans, P = -inf where not a valid pair: the initial values.
  std::vector<T> P(size_t(w) * w, neg), Zn(size_t(w) * w, T(0)), Zt(size_t(w) * w, T(0));
  for (int i = n - 1; i >= 0; --i) {
    const T* Prow = &P[size_t(i) * w];
    for (int j = i; j < n; ++j) {
      T p = neg;
      if (j - i > h) {
        T st = stack[((x[i] * 5 + x[j]) * 5 + x[j - 1]) * 5 + x[i + 1]];
        T inner = logaddexp(st + P[size_t(i + 1) * w + j - 1], loop + Zn[size_t(i + 1) * w + j - 1]);
        p = pair[x[i] * 5 + x[j]] + (phi ? phi[size_t(i) * n + j] : T(0)) + inner;
        P[size_t(i) * w + j] = p;
      }
      // Zn = LSE(unpaired + Z[i+1][j], P[i][k] + Z[k+1][j] for k = i+h+1 .. j-1).
      T zn = unpaired[x[i]] + Zt[size_t(j) * w + i + 1];
      const int k0 = i + h + 1, len = j - k0;
      if (len > 0) zn = split_lse(zn, Prow + k0, &Zt[size_t(j) * w + 1] + k0, len);  // b[k] = Z[k+1][j]
      Zn[size_t(i) * w + j] = zn;
      Zt[size_t(j) * w + i] = logaddexp(zn, p);
    }
  }
  return Zt[size_t(n - 1) * w + 0];
}

// Sequences are rows of tokens[B, L]; sequence b uses its first lengths[b] tokens
// and, if phi is given, the top-left lengths[b]^2 block of phi[b] ([B, L, L]).
template <class T>
void inside_batch(const T* stack, const T* pair, const T* unpaired, T loop, const T* phi,
                  const int32_t* tokens, const int32_t* lengths, int B, int L, int h,
                  T* out, int threads) {
  std::atomic<int> next{0};
  auto work = [&] {
    std::vector<T> phib;
    for (int b; (b = next.fetch_add(1)) < B;) {
      int n = lengths ? lengths[b] : L;
      const T* ph = nullptr;
      if (phi) {  // repack the n x n block so `inside` can index it densely
        phib.resize(size_t(n) * n);
        for (int r = 0; r < n; ++r)
          std::copy_n(phi + (size_t(b) * L + r) * L, n, &phib[size_t(r) * n]);
        ph = phib.data();
      }
      out[b] = inside<T>(stack, pair, unpaired, loop, ph, tokens + size_t(b) * L, n, h);
    }
  };
  threads = std::max(1, std::min(threads, B));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
}

}  // namespace

extern "C" {
float inside_f32(const float* s, const float* pr, const float* u, float loop, const float* phi,
                 const int32_t* x, int n, int h) {
  return inside<float>(s, pr, u, loop, phi, x, n, h);
}
double inside_f64(const double* s, const double* pr, const double* u, double loop,
                  const double* phi, const int32_t* x, int n, int h) {
  return inside<double>(s, pr, u, loop, phi, x, n, h);
}
void inside_batch_f32(const float* s, const float* pr, const float* u, float loop,
                      const float* phi, const int32_t* tok, const int32_t* len, int B, int L,
                      int h, float* out, int threads) {
  inside_batch<float>(s, pr, u, loop, phi, tok, len, B, L, h, out, threads);
}
void inside_batch_f64(const double* s, const double* pr, const double* u, double loop,
                      const double* phi, const int32_t* tok, const int32_t* len, int B, int L,
                      int h, double* out, int threads) {
  inside_batch<double>(s, pr, u, loop, phi, tok, len, B, L, h, out, threads);
}
}
