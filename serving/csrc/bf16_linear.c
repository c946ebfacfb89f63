/* A bf16 linear for CPUs without bf16 instructions (AVX2 + FMA):

       y[m, n] = bf16( sum_k x[m, k] * w[n, k]  +  bias[n] )

   x, w and bias are bf16 (widened to float32 exactly), the sum is accumulated in float32 and the result
   rounded to the nearest bf16 (ties to even), as a bf16 kernel with float32 accumulation does.

   Why: without bf16 hardware, torch's bf16 products cost about as much per row as the first one, so a
   verification forward over K + 1 tokens cost twice a one-token forward. Here every weight is read from
   memory once per call and reused, widened in registers, for all rows: a few rows cost about what one
   costs. Four output columns are computed together, for up to three rows at a time: 12 accumulators,
   3 rows of x and one widened weight vector fill the 16 AVX registers exactly (a fourth weight vector
   live spilled an accumulator to the stack, and the store-to-load round trip in the inner loop halved
   the speed). The weights of a column block stay in L1 while later rows reuse them.

   Built at first use by serving/bf16_kernel.py (cc -O3 -mavx2 -mfma -fopenmp); no Python or torch
   headers, called through ctypes. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static inline float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays a NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline __m256 load_bf16x8(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* columns n..n+3 of rows m0..m0+MB-1; xf holds x widened to float32 */
#define TILE(MB)                                                                                       \
    static inline void tile##MB(const float *xf, const uint16_t *w, const uint16_t *bias, uint16_t *y, \
                                int m0, int n, int N, int K) {                                          \
        __m256 acc[MB][4];                                                                              \
        for (int j = 0; j < MB; j++)                                                                    \
            for (int c = 0; c < 4; c++) acc[j][c] = _mm256_setzero_ps();                                \
        const uint16_t *w0 = w + (size_t)n * K;                                                         \
        for (int k = 0; k < K; k += 8) {                                                                \
            __m256 xv[MB];                                                                              \
            for (int j = 0; j < MB; j++) xv[j] = _mm256_loadu_ps(xf + (size_t)(m0 + j) * K + k);       \
            for (int c = 0; c < 4; c++) {                                                               \
                __m256 v = load_bf16x8(w0 + (size_t)c * K + k); /* one widened weight vector live */   \
                for (int j = 0; j < MB; j++) acc[j][c] = _mm256_fmadd_ps(xv[j], v, acc[j][c]);          \
            }                                                                                           \
        }                                                                                               \
        for (int j = 0; j < MB; j++)                                                                    \
            for (int c = 0; c < 4; c++)                                                                 \
                y[(size_t)(m0 + j) * N + n + c] =                                                       \
                    to_bf16(sum8(acc[j][c]) + (bias ? from_bf16(bias[n + c]) : 0.0f));                 \
    }
TILE(1)
TILE(2)
TILE(3)

/* one column for every row: the last N % 4 columns */
static void column(const float *xf, const uint16_t *w, const uint16_t *bias, uint16_t *y, int M, int n, int N,
                   int K) {
    for (int m = 0; m < M; m++) {
        __m256 acc = _mm256_setzero_ps();
        for (int k = 0; k < K; k += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(xf + (size_t)m * K + k), load_bf16x8(w + (size_t)n * K + k), acc);
        y[(size_t)m * N + n] = to_bf16(sum8(acc) + (bias ? from_bf16(bias[n]) : 0.0f));
    }
}

/* x: M x K, w: N x K, bias: N or NULL, y: M x N (all bf16, row-major, contiguous); xf: M * K floats of
   scratch. K must be a multiple of 8. */
void bf16_linear(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y, float *xf, int M,
                 int N, int K, int threads) {
    for (long i = 0; i < (long)M * K; i++) xf[i] = from_bf16(x[i]);
    int N4 = N / 4 * 4;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int n = 0; n < N4; n += 4) {
        int m = 0;
        for (; m + 3 <= M; m += 3) tile3(xf, w, bias, y, m, n, N, K);
        if (M - m == 2) tile2(xf, w, bias, y, m, n, N, K);
        else if (M - m == 1) tile1(xf, w, bias, y, m, n, N, K);
    }
    for (int n = N4; n < N; n++) column(xf, w, bias, y, M, n, N, K);
}
