/* brisklm's native CPU kernels: the float32 forward pass of a Llama-family decoder for rows of up
 * to 512 tokens (decode steps, speculative verification, prompts), in one OpenMP parallel
 * region, and the same row-invariant matrix product on its own (for every row count). Weights
 * (the products' and the embedding table) are float32, bfloat16 or float16 (WT_BF16, WT_F16,
 * below), the products' also GPTQ int4 (WT_INT4); everything else, and all arithmetic, is
 * float32.
 *
 * Why: at batch 1 a decode step reads every weight once and should run at memory bandwidth. Run
 * as ~25 torch ops per layer, each parallel kernel forks and joins the thread pool and pays its
 * dispatch cost, and the small products stop short of the bandwidth of one large read (see
 * docs/benchmarks.md). Here every phase of every layer runs inside one parallel region, separated
 * by barriers, the products split by panels of output rows across the threads (each thread its
 * share, then what is left of the others': matmul_team).
 *
 * Every token is computed by the same instruction sequence whatever else is in the call (other
 * tokens, other rows, the thread count), so a row's result does not depend on its batch.
 *
 * Built at run time by brisklm/kernels/native.py with the system C compiler (-O3 -march=native
 * -fopenmp); the OpenMP runtime it links is the one torch has already loaded (same soname), so
 * both share one thread pool. Shapes and layouts are checked on the Python side.
 */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
/* A real AVX-512 build (the "avx512-code" test build defines __AVX512F__ over AVX2 instructions;
 * BW comes with AVX-512 on every CPU since Skylake-X, the test build lacks it). */
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define REAL_AVX512 1
#include <immintrin.h> /* cload16's bfloat16 widening only */
#endif
#ifdef _OPENMP
#include <omp.h>
#define THREAD_NUM() omp_get_thread_num()
#define TEAM_SIZE() omp_get_num_threads()
#else
#define THREAD_NUM() 0
#define TEAM_SIZE() 1
#endif

typedef float vf __attribute__((vector_size(64)));
#define VW 16   /* floats per vector */
#define MAX_TOKENS 512 /* tokens per forward call */
/* Bytes: how far ahead of a stream the loops prefetch into L2: the weights in the products of
 * several tokens (and keys in dot_keys); 8 KB was 2-5% faster than 4 KB at 2-16 tokens.
 * Attention's 16-key scores and its values are read without: with software prefetches there, a
 * thread read keys and values from DRAM at 36 GB/s, without at 50 (the hardware prefetchers
 * follow those streams alone), and the 125M model's six-token step at 3,968 positions took
 * 23.2 ms against 21.2. */
#define PREFETCH_AHEAD 8192
/* Bytes of weights from which a call's products count as streamed from memory (``stream``): a
 * forward pass's whole model, or one product called on its own. Then a single token's float32
 * rows in a lone panel are prefetched too (see panel_tile and panel_group). The bundled 22 MB
 * model stays under it: on an AVX-512 VM its one-token step was faster without (0.46-0.52 ms
 * against 0.54-0.60). */
#define STREAM_FROM ((int64_t)64 << 20)

static inline vf vload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* s in every lane. Written as a splat, not (vf){0} + s: that adds 0.0f first (it turns -0.0f into
 * +0.0f, so the compiler must keep it), an extra dependent operation per broadcast. */
static inline vf vsplat(float s) {
    return (vf){s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s};
}

/* The sum of v's lanes as a tree (halves added three times, then pairs): the compiler may not
 * reorder a float sum, and summed lane by lane it is 16 dependent additions, which made every
 * attention score wait ~60 cycles. */
static inline float vsum(vf v) {
    typedef float v8 __attribute__((vector_size(32)));
    typedef float v4 __attribute__((vector_size(16)));
    v8 lo, hi;
    memcpy(&lo, &v, sizeof lo);
    memcpy(&hi, (const char *)&v + sizeof lo, sizeof hi);
    const v8 s8 = lo + hi;
    v4 a, b;
    memcpy(&a, &s8, sizeof a);
    memcpy(&b, (const char *)&s8 + sizeof a, sizeof b);
    const v4 s4 = a + b;
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

/* Element types of packed weights. Half-precision weights (bfloat16, float16) are widened to
 * float32 as they are loaded (exactly: a bfloat16 is the top half of a float32, and every float16
 * is a float32 too) and then multiplied as float32 weights are, in the same order: a product over
 * half-precision weights gives the bits the float32 product gives over the same values, and reads
 * half the bytes.
 *
 * A bfloat16 panel row holds its 32 outputs paired: 32-bit word w holds output w in its low half
 * and output w + 16 in its high half (native.pack). Two operations per word then widen both, with
 * no shuffles: the word shifted left by 16 is output w as a float32, the word with its low half
 * cleared is output w + 16. (gcc turned a plain 16-to-32-bit conversion into four shuffles per
 * eight weights, and one token's product over bfloat16 weights ran at 18 GB/s against 28 for
 * float32 on the Zen 3.) */
#define WT_F32 0
#define WT_BF16 1
#define WT_F16 2
#define WT_SIZE(wt) ((wt) == WT_F32 ? 4 : 2)
#define HIGH_HALF 0xFFFF0000u

/* GPTQ int4 weights (WT_INT4, products only: not the embedding table or a KV cache). A panel's
 * rows come in blocks of eight (k is a multiple of 8): 32 32-bit words, word o holding output o's
 * 4-bit codes of the block's eight rows, row r in bits 4r to 4r + 3. A row's codes are then a
 * shift and a mask of the block's words, lane by lane, with no byte widening (gcc turned a
 * widening of eight bytes to eight 32-bit lanes into scalar code: 30 cycles a row). Each input
 * belongs to a group (GPTQ's
 * g_idx, any order: act-order needs no permutation of the activations), and each group has a
 * zero point and a scale per output, stored as float32 in a block of 64 per panel and group: the
 * 32 outputs' zero points, then their 32 scales. A weight is (code - zero) * scale, computed in
 * float32 as it is read (exactly GPTQ's dequantization, scale * (q - zero), and the same value
 * dequantize_gptq gives): a product over int4 weights gives the bits the float32 product gives
 * over the dequantized weight, and reads an eighth of its bytes (plus the groups' blocks).
 *
 * A zero point is stored as 2^23 + zero (INT4_BIAS), and a code becomes a float32 by setting the
 * low bits of 2^23's mantissa to it (INT4_BIAS_BITS | code: the float 2^23 + code), one
 * instruction with the mask where AVX-512 merges the two bit operations (vpternlogd) instead of a
 * mask and a conversion; (2^23 + code) - (2^23 + zero) is code - zero exactly (both integers
 * below 2^24, held exactly, and so is their difference), so the weight keeps its bits. With the
 * loops below, the one-token product of a 4096x4096 layer took 0.87x the time (session 60, Zen
 * 4); the AVX2 code runs as fast either way (an OR where the conversion was). */
#define WT_INT4 3
#define INT4_BIAS 8388608.0f /* 2^23 */
#define INT4_BIAS_BITS 0x4B000000
/* Bytes of one panel row (on average, for int4), and of a panel of k rows. */
#define ROW_BYTES(wt) ((wt) == WT_INT4 ? NB / 2 : NB * WT_SIZE(wt))
#define PANEL_BYTES(k, wt) ((int64_t)(k) * ROW_BYTES(wt))

/* An int4 product's weight (what a WT_INT4 product's ``packed`` points to). */
typedef struct {
    const uint8_t *codes;     /* panel after panel, k rows of ROW_BYTES each */
    const float *zs;          /* per panel, zs_panel floats: one block of 64 per group */
    const int32_t *group_at;  /* [k]: input i's block in a panel's zs (its group times 64) */
    int64_t zs_panel;
} q4_weight;

/* One int4 panel's blocks and the inputs' offsets into them (unused for other weight types). */
typedef struct {
    const float *zs;
    const int32_t *group_at;
} q4_panel;

typedef uint32_t vu __attribute__((vector_size(64)));
typedef int32_t vq __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));

/* A float16 as a float32 (exact; a NaN comes back quiet, as F16C's conversion returns it). */
static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1Fu,
                   mantissa = h & 0x3FFu;
    uint32_t bits;
    if (exponent == 0x1F) { /* infinity, NaN */
        bits = sign | 0x7F800000u | (mantissa ? mantissa << 13 | 0x400000u : 0);
    } else if (exponent) {
        bits = sign | (exponent + 112) << 23 | mantissa << 13;
    } else { /* zero or subnormal: mantissa * 2^-24, exact in float32 */
        const float value = (float)mantissa * 5.9604644775390625e-8f;
        memcpy(&bits, &value, sizeof bits);
        bits |= sign;
    }
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

/* Eight float16 weights as float32: one F16C instruction where the CPU has it (the builtin, not
 * immintrin.h's intrinsic, so that the "avx512-code" test build, which defines __AVX512F__ on an
 * AVX2 CPU, compiles; gcc 12 turned __builtin_convertvector of _Float16 vectors into eight scalar
 * conversions), else half_to_float lane by lane. A float16 panel row keeps its outputs in order:
 * the conversion widens eight neighbours at once. */
static inline __attribute__((always_inline)) v8f half8(const uint16_t *p) {
#if defined(__F16C__)
    typedef short v8h __attribute__((vector_size(16)));
    v8h h;
    memcpy(&h, p, sizeof h);
    return (v8f)__builtin_ia32_vcvtph2ps256(h);
#else
    v8f v;
    for (int i = 0; i < 8; i++) v[i] = half_to_float(p[i]);
    return v;
#endif
}

/* Sixteen float16 weights or cache elements as float32: one conversion of all sixteen in a real
 * AVX-512 build; else two of eight joined, which gcc 12 joined through the stack (two 32-byte
 * stores, then a 64-byte load that cannot take them from the store buffer). (__F16C__ too: the
 * "no-f16c" test build, -mno-f16c on an AVX-512 CPU, keeps testing half8's fallback.) */
static inline __attribute__((always_inline)) vf half16(const uint16_t *p) {
#if defined(REAL_AVX512) && defined(__F16C__)
    return (vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#else
    const v8f part[2] = {half8(p), half8(p + 8)};
    vf v;
    memcpy(&v, part, sizeof v);
    return v;
#endif
}

/* KV caches hold float32, bfloat16 or float16 elements (the codes of the weight types: the
 * cache's type, ct below). A half-precision cache is written rounded to nearest even, as torch's
 * conversions round, and read widened exactly; attention computes in float32 either way. */
#define CACHE_AT(base, i, ct) ((const char *)(base) + (int64_t)(i) * WT_SIZE(ct))

static inline __attribute__((always_inline)) float cload1(const void *base, int64_t i, int ct) {
    if (ct == WT_BF16) {
        const uint32_t bits = (uint32_t)((const uint16_t *)base)[i] << 16;
        float out;
        memcpy(&out, &bits, sizeof out);
        return out;
    }
    if (ct == WT_F16) return half_to_float(((const uint16_t *)base)[i]);
    return ((const float *)base)[i];
}

/* Sixteen cache elements from element i as float32. A bfloat16 element is widened by zero
 * extension and a shift: with AVX-512 at hand one vpmovzxwd of all sixteen (gcc 12 turned the
 * generic conversion into two 8-lane conversions, an extraction and an insertion). */
static inline __attribute__((always_inline)) vf cload16(const void *base, int64_t i, int ct) {
    if (ct == WT_BF16) {
#if defined(REAL_AVX512)
        const __m512i wide = _mm512_cvtepu16_epi32(
            _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i)));
        return (vf)_mm512_slli_epi32(wide, 16);
#else
        typedef uint16_t v16u16 __attribute__((vector_size(32)));
        v16u16 h;
        memcpy(&h, (const uint16_t *)base + i, sizeof h);
        return (vf)(__builtin_convertvector(h, vu) << 16);
#endif
    }
    if (ct == WT_F16) return half16((const uint16_t *)base + i);
    return vload((const float *)base + i);
}

/* float32 to bfloat16, to nearest even, as torch converts (a NaN becomes 0x7FC0, where torch 2.13
 * gives 0xFFFF: another NaN either way). */
static inline uint16_t float_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
    return (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

/* float32 to float16, to nearest even (overflow to infinity, NaNs quiet), as F16C's conversion
 * with rounding mode 0 and torch's convert. */
static inline uint16_t float_to_half(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    const uint32_t mag = bits & 0x7FFFFFFFu;
    if (mag > 0x7F800000u) return sign | 0x7E00u | (uint16_t)((mag >> 13) & 0x3FFu);
    if (mag >= 0x477FF000u) return sign | 0x7C00u; /* 65520 and up: infinity */
    if (mag < 0x38800000u) { /* below 2^-14: a subnormal float16 (or zero), mag * 2^24 rounded */
        float scaled;
        memcpy(&scaled, &mag, sizeof scaled);
        scaled = (scaled * 16777216.0f + 8388608.0f) - 8388608.0f; /* exact product, one rounding */
        return sign | (uint16_t)scaled;
    }
    uint32_t h = (mag - 0x38000000u) >> 13; /* exponent rebiased, mantissa's top ten bits */
    const uint32_t rest = mag & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++; /* a carry rounds up the exponent */
    return sign | (uint16_t)h;
}

/* Row x of d floats into the cache at element i (of type ct). */
static void cstore_row(void *base, int64_t i, const float *x, int d, int ct) {
    if (ct == WT_BF16) {
        uint16_t *out = (uint16_t *)base + i;
        for (int c = 0; c < d; c++) out[c] = float_to_bf16(x[c]);
    } else if (ct == WT_F16) {
        uint16_t *out = (uint16_t *)base + i;
        int c = 0;
#if defined(__F16C__)
        typedef short v8h __attribute__((vector_size(16)));
        for (; c + 8 <= d; c += 8) {
            v8f v;
            memcpy(&v, x + c, sizeof v);
            const v8h h = __builtin_ia32_vcvtps2ph256(v, 0); /* 0: to nearest even */
            memcpy(out + c, &h, sizeof h);
        }
#endif
        for (; c < d; c++) out[c] = float_to_half(x[c]);
    } else {
        memcpy((float *)base + i, x, sizeof(float) * d);
    }
}

/* out[r] = keys[r] . q (length d) for nr <= KB keys spaced d apart: attention's scores, KB keys of
 * a head at a time, each with its own accumulator. */
#define KB 4
static inline __attribute__((always_inline)) void dot_keys(
    const void *keys, int nr, const float *q, int d, float *out, int ct) {
    vf acc[KB];
    for (int r = 0; r < KB; r++) acc[r] = (vf){0};
    int i = 0;
    for (; i + VW <= d; i += VW) {
        const vf qv = vload(q + i);
        for (int r = 0; r < nr; r++) {
            acc[r] += cload16(keys, (int64_t)r * d + i, ct) * qv;
            /* Keys further on, PREFETCH_AHEAD bytes ahead (the keys are contiguous). Measured
             * when this served every key (it now serves the keys after the last 16-key block, and
             * head sizes that are not a multiple of 16): at 1,000 cached positions the bundled
             * model's step took 1.36-1.51 ms prefetching the next KB keys and 1.67-1.78 without. */
            __builtin_prefetch(CACHE_AT(keys, (int64_t)r * d + i, ct) + PREFETCH_AHEAD, 0, 2);
        }
    }
    for (int r = 0; r < nr; r++) {
        float s = vsum(acc[r]);
        for (int c = i; c < d; c++) s += cload1(keys, (int64_t)r * d + c, ct) * q[c];
        out[r] = s;
    }
}

static inline __attribute__((always_inline)) void key_scores(const void *keys, int nr,
                                                             const float *q, int d, float *out,
                                                             int ct) {
    switch (nr) {
        case 4: dot_keys(keys, 4, q, d, out, ct); break;
        case 3: dot_keys(keys, 3, q, d, out, ct); break;
        case 2: dot_keys(keys, 2, q, d, out, ct); break;
        case 1: dot_keys(keys, 1, q, d, out, ct); break;
        default: break;
    }
}

/* gcc 11 and older lack __builtin_shufflevector (BRISK_NO_SHUFFLEVECTOR: their path, for tests). */
#if !defined(BRISK_NO_SHUFFLEVECTOR) && (defined(__clang__) || __GNUC__ >= 12)
#define HAVE_SHUFFLEVECTOR 1
typedef int32_t vi __attribute__((vector_size(64)));
#define SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)

/* The lane sums of 16 vectors as one vector (lane r: the sum of v[r]'s lanes), by exactly vsum's
 * tree for each: halves, then quarters, then (0 + 2) + (1 + 3). Four levels of pairwise
 * shuffles and adds (2.9 operations per vector instead of vsum's ~8), then the lanes back in key
 * order (the tree leaves them bit-reversed). */
static inline vf lane_sums16(const vf v[16]) {
    vf w[8], x[4], y[2];
    for (int k = 0; k < 8; k++)
        w[k] = SHUF(v[2 * k], v[2 * k + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               SHUF(v[2 * k], v[2 * k + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int k = 0; k < 4; k++)
        x[k] = SHUF(w[2 * k], w[2 * k + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
               SHUF(w[2 * k], w[2 * k + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int k = 0; k < 2; k++)
        y[k] = SHUF(x[2 * k], x[2 * k + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
               SHUF(x[2 * k], x[2 * k + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    const vf z = SHUF(y[0], y[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +
                 SHUF(y[0], y[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    return SHUF(z, z, 0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15);
}

/* keys[r] . q for 16 keys spaced d apart (d a multiple of VW): each key summed exactly as
 * dot_keys sums it, the 16 results in one vector. */
static inline __attribute__((always_inline)) vf dot16_keys(const void *keys, const float *q, int d,
                                                           int ct) {
    vf acc[16];
    for (int r = 0; r < 16; r++) acc[r] = (vf){0};
    for (int i = 0; i + VW <= d; i += VW) {
        const vf qv = vload(q + i);
        for (int r = 0; r < 16; r++) {
            acc[r] += cload16(keys, (int64_t)r * d + i, ct) * qv; /* no prefetch: PREFETCH_AHEAD */
        }
    }
    return lane_sums16(acc);
}

/* dot16_keys over a bfloat16 cache read in pairs (q paired: pair_query over 32 elements), for the
 * 16 keys r < 16 (d a multiple of 32); keys at r >= valid are not read: key valid - 1 is computed
 * in their place. Each key's score by the same instructions wherever it falls (in a full block or
 * the last one), as dot8_keys_paired. */
static inline __attribute__((always_inline)) vf dot16_keys_paired(const void *keys, int valid,
                                                                  const float *qp, int d) {
    int64_t k[16];
    for (int r = 0; r < 16; r++) k[r] = (int64_t)(r < valid ? r : valid - 1) * d;
    vf acc[16];
    for (int r = 0; r < 16; r++) acc[r] = (vf){0};
    for (int i = 0; i < d; i += 2 * VW) {
        const vf qe = vload(qp + i), qo = vload(qp + i + VW);
        for (int r = 0; r < 16; r++) {
            vu w;
            memcpy(&w, (const uint16_t *)keys + k[r] + i, sizeof w);
            acc[r] += (vf)(w << 16) * qe;
            acc[r] += (vf)(w & HIGH_HALF) * qo;
        }
    }
    return lane_sums16(acc);
}

static inline vf vmax(vf a, vf b) {
    const vi take_a = (vi)(a > b);
    return (vf)(((vi)a & take_a) | ((vi)b & ~take_a));
}
#endif

/* The products' weights are packed once at load (brisklm/kernels/native.py: pack) into panels of
 * NB output rows stored k-major: panel p holds rows [p * NB, p * NB + NB) as k x NB floats, the
 * last panel zero-padded. A register tile of MB tokens x NB outputs then takes, for each k, two
 * vector loads of the panel and one broadcast per token: no horizontal sums, the weights read as
 * one sequential stream, and each output summed over k in the same order (two chains, even and odd
 * k) whatever the number of tokens, the tile a token lands in or the thread: the row invariance. As fast
 * as oneDNN's packed product from 1 to 512 rows on this project's AVX-512 VM (docs/benchmarks.md).
 *
 * The tile is sized to the vector registers. With AVX-512 (32 registers of 16 floats) it is
 * 6 tokens x 2 vectors x 2 chains = 24 accumulators. An AVX2 CPU (16 registers of 8 floats) would
 * need 48 registers for that tile and spills it to the stack: the products ran at 7-10 GFLOPS on
 * a Zen 3 against 14-85 for MKL's. There the tile is 3 tokens x 4 vectors x 1 chain
 * (12 accumulators): 21-115 GFLOPS on the same products (docs/benchmarks.md). */
#define NB 32 /* outputs per panel */

/* 16 int4 weights as float32 (see WT_INT4): the codes in bits shift..shift + 3 of words (one
 * word per output), z their 16 outputs' zero points in a group's block (their scales 2 * VW
 * floats on). */
static inline __attribute__((always_inline)) vf int4_weights(vq words, int shift, const float *z) {
    return ((vf)(((words >> shift) & 15) | INT4_BIAS_BITS) - vload(z)) * vload(z + 2 * VW);
}

/* The 32 weights of int4 panel row i as float32 (outputs 0-15 and 16-31), with its group's block
 * in qp: what widened_panel copies (the tiles have loops of their own: int4_group, int4_tile). */
static inline __attribute__((always_inline)) void int4_row(const void *panel, int64_t i,
                                                           q4_panel qp, vf *lo, vf *hi) {
    const int shift = 4 * (int)(i & 7);
    const int32_t *words = (const int32_t *)panel + (i >> 3) * NB;
    vq w0, w1;
    memcpy(&w0, words, sizeof w0);
    memcpy(&w1, words + VW, sizeof w1);
    const float *z = qp.zs + qp.group_at[i];
    *lo = int4_weights(w0, shift, z);
    *hi = int4_weights(w1, shift, z + VW);
}

/* The 32 weights of a float32 or half-precision panel row, element at (a multiple of NB), as
 * float32: outputs 0-15 and 16-31. */
static inline __attribute__((always_inline)) void wrow(const void *panel, int64_t at, int wt,
                                                       vf *lo, vf *hi) {
    if (wt == WT_BF16) {
        vu u;
        memcpy(&u, (const uint16_t *)panel + at, sizeof u);
        *lo = (vf)(u << 16);
        *hi = (vf)(u & HIGH_HALF);
    } else if (wt == WT_F16) {
        *lo = half16((const uint16_t *)panel + at);
        *hi = half16((const uint16_t *)panel + at + VW);
    } else {
        *lo = vload((const float *)panel + at);
        *hi = vload((const float *)panel + at + VW);
    }
}

#if defined(__AVX512F__)
#define MB 6  /* tokens per register tile */
/* Calls of this many tokens or more widen each half-precision panel once (matmul_panel); 0: never.
 * The AVX-512 tile has room to widen in registers, so it also takes MB tokens a tile over
 * half-precision weights: on a Zen 4 (session 60) the bfloat16 4096x4096 product of 64 tokens took
 * 9.87 ms, the float32 one 9.66 (bench/int4_gemv.py). */
#define WIDEN_FROM 0
#define MB_HALF MB

static inline __attribute__((always_inline)) void panel_tile(const float *x, int64_t ldx, int mt,
                                                             const void *panel, int k, float *out,
                                                             int wt, int stream) {
    /* Two partial sums per output, over even and over odd k, added at the end: two FMA chains,
     * so that a single token is not held to one FMA latency per k. */
    vf a0[MB], a1[MB], c0[MB], c1[MB];
    for (int m = 0; m < MB; m++) a0[m] = a1[m] = c0[m] = c1[m] = (vf){0};
    int i = 0;
    for (; i + 2 <= k; i += 2) {
        const int64_t at = (int64_t)i * NB;
        const char *row = (const char *)panel + (int64_t)i * ROW_BYTES(wt);
        vf b0, b1, d0, d1;
        wrow(panel, at, wt, &b0, &b1);
        wrow(panel, at + NB, wt, &d0, &d1);
        /* With two or more tokens, the four cache lines PREFETCH_AHEAD bytes ahead in the stream,
         * into L2 (panels are contiguous, so past a panel's end this is the next panel's start):
         * this keeps loads in flight while a tile of several tokens computes. With the earlier
         * prefetch (two of the four lines, one whole panel ahead) a 6-token tile cost the
         * products' compute on top of their memory time. A single token's loop waits on memory
         * only, and the hardware prefetchers serve it better alone: the bundled model's step
         * 0.54-0.60 ms with these prefetches, 0.46-0.52 without (float32). Half-precision rows
         * are prefetched for a single token too: see the AVX2 tile below (measured there only).
         * So are a model's whose weights stream from memory every step (``stream``: see
         * STREAM_FROM): on a Sapphire Rapids Xeon the 125M model's one-token call took 0.93x the
         * time with them (12.8-13.0 ms against 13.7-13.9), the bundled model's 0.998x. That was
         * before a single token read up to GROUP panels at once (panel_group, which leaves float32
         * rows to the hardware prefetchers); here it is the lone panels left over. (Int4 panels
         * have tiles of their own: int4_tile.) */
        if (mt > 1 || wt != WT_F32 || stream) { /* four lines of float32, two of halves */
            for (int line = 0; line < 2 * NB * WT_SIZE(wt) / 64; line++)
                __builtin_prefetch(row + PREFETCH_AHEAD + 64 * line, 0, 2);
        }
        for (int m = 0; m < mt; m++) {
            const vf xe = vsplat(x[m * ldx + i]), xo = vsplat(x[m * ldx + i + 1]);
            a0[m] += xe * b0;
            a1[m] += xe * b1;
            c0[m] += xo * d0;
            c1[m] += xo * d1;
        }
    }
    if (i < k) {
        const int64_t at = (int64_t)i * NB;
        vf b0, b1;
        wrow(panel, at, wt, &b0, &b1);
        for (int m = 0; m < mt; m++) {
            const vf xe = vsplat(x[m * ldx + i]);
            a0[m] += xe * b0;
            a1[m] += xe * b1;
        }
    }
    for (int m = 0; m < mt; m++) {
        const vf s0 = a0[m] + c0[m], s1 = a1[m] + c1[m];
        memcpy(out + m * NB, &s0, sizeof(vf));
        memcpy(out + m * NB + VW, &s1, sizeof(vf));
    }
}

#define GROUP 4 /* panels a single token reads at once */

/* One token over the g (<= GROUP) consecutive panels from ``panel`` (panel_elems weights apart):
 * each panel's sums are panel_tile's for one token, the same operations in the same order (the
 * same bits), but the g panels' rows are read in one loop, g streams in flight at once. A single
 * token waits on memory only, and one core reads several streams faster than one: on a Xeon with
 * AMX (2 vCPUs, session 42) two threads summing 400 MB read 36.6 GB/s as one stream each, 37.9
 * as two, 40.0 as four and 40.4 as eight (interleaved 256-byte visits, means of 18 rounds), and
 * the 125M model's one-token step took 0.926x the time of one panel at a time (10.39 against
 * 11.22 ms; bench/native_kernel_ab.py --preset 125m --rows 1); six panels at once were level
 * with four and eight 1.01x slower (32 accumulators: all the registers). Float32 rows are not
 * prefetched here (with the prefetch of panel_tile's ``stream`` case: 1.03x slower); bfloat16
 * and float16 rows are, as in panel_tile (bfloat16 without: 1.24x slower). Called with g a
 * constant (matmul_panels): with g known only at run time gcc kept the accumulators on the stack,
 * a load and a store around every FMA (int4's one-token product, which went through this loop
 * then, took 1.13x the time; float32 and bfloat16 models' one-token steps 1.01x and 1.03x). */
static inline __attribute__((always_inline)) void panel_group(const float *x, const void *panel,
                                                              int64_t panel_elems, int g, int k,
                                                              float *out, int wt) {
    vf a0[GROUP], a1[GROUP], c0[GROUP], c1[GROUP];
    for (int j = 0; j < GROUP; j++) a0[j] = a1[j] = c0[j] = c1[j] = (vf){0};
    int i = 0;
    for (; i + 2 <= k; i += 2) {
        const int64_t at = (int64_t)i * NB;
        const vf xe = vsplat(x[i]), xo = vsplat(x[i + 1]);
        for (int j = 0; j < g; j++) {
            const int64_t pat = j * panel_elems + at;
            vf b0, b1, d0, d1;
            wrow(panel, pat, wt, &b0, &b1);
            wrow(panel, pat + NB, wt, &d0, &d1);
            if (wt == WT_BF16 || wt == WT_F16) {
                const char *row = (const char *)panel + pat * WT_SIZE(wt);
                for (int line = 0; line < 2 * NB * WT_SIZE(wt) / 64; line++)
                    __builtin_prefetch(row + PREFETCH_AHEAD + 64 * line, 0, 2);
            }
            a0[j] += xe * b0;
            a1[j] += xe * b1;
            c0[j] += xo * d0;
            c1[j] += xo * d1;
        }
    }
    if (i < k) {
        const int64_t at = (int64_t)i * NB;
        const vf xe = vsplat(x[i]);
        for (int j = 0; j < g; j++) {
            vf b0, b1;
            wrow(panel, j * panel_elems + at, wt, &b0, &b1);
            a0[j] += xe * b0;
            a1[j] += xe * b1;
        }
    }
    for (int j = 0; j < g; j++) {
        const vf s0 = a0[j] + c0[j], s1 = a1[j] + c1[j];
        memcpy(out + j * NB, &s0, sizeof(vf));
        memcpy(out + j * NB + VW, &s1, sizeof(vf));
    }
}

/* Int4 panels (see WT_INT4) have loops of their own: k steps by whole blocks of eight rows, each
 * block's words loaded once and the rows unrolled, so that every row's shift is a constant. Each
 * output's sum is panel_tile's over the dequantized rows, the same operations in the same order
 * (even and odd rows in two chains, added at the end; k is a multiple of 8): the same bits.
 *
 * int4_group: one token over the g (<= GROUP, a constant) consecutive panels from ``panel`` (zs:
 * the first's blocks, zs_panel floats apart), as panel_group. A single int4 token is bound by its
 * arithmetic, not by memory (a weight is a shift, a mask, a subtraction and a multiplication
 * before its FMA): on a Zen 4 the 4096x4096 product took 0.62 ms a call before these loops and the
 * constant g, 0.47 after, torch's int4 kernel 0.49 in bfloat16 (bench/int4_gemv.py). */
static inline __attribute__((always_inline)) void int4_group(const float *x, const void *panel,
                                                             q4_panel qp, int64_t zs_panel, int g,
                                                             int k, float *out) {
    vf a0[GROUP], a1[GROUP], c0[GROUP], c1[GROUP];
    for (int j = 0; j < GROUP; j++) a0[j] = a1[j] = c0[j] = c1[j] = (vf){0};
    for (int i0 = 0; i0 < k; i0 += 8) {
        vq w0[GROUP], w1[GROUP];
        for (int j = 0; j < g; j++) {
            const int32_t *words =
                (const int32_t *)((const char *)panel + j * PANEL_BYTES(k, WT_INT4)) + i0 / 8 * NB;
            memcpy(&w0[j], words, sizeof(vq));
            memcpy(&w1[j], words + VW, sizeof(vq));
            __builtin_prefetch((const char *)words + PREFETCH_AHEAD, 0, 2);
            __builtin_prefetch((const char *)words + PREFETCH_AHEAD + 64, 0, 2);
        }
#pragma GCC unroll 4
        for (int r = 0; r < 8; r += 2) {
            const vf xe = vsplat(x[i0 + r]), xo = vsplat(x[i0 + r + 1]);
            const float *ze = qp.zs + qp.group_at[i0 + r], *zo = qp.zs + qp.group_at[i0 + r + 1];
            for (int j = 0; j < g; j++) {
                a0[j] += xe * int4_weights(w0[j], 4 * r, ze + j * zs_panel);
                a1[j] += xe * int4_weights(w1[j], 4 * r, ze + j * zs_panel + VW);
                c0[j] += xo * int4_weights(w0[j], 4 * r + 4, zo + j * zs_panel);
                c1[j] += xo * int4_weights(w1[j], 4 * r + 4, zo + j * zs_panel + VW);
            }
        }
    }
    for (int j = 0; j < g; j++) {
        const vf s0 = a0[j] + c0[j], s1 = a1[j] + c1[j];
        memcpy(out + j * NB, &s0, sizeof(vf));
        memcpy(out + j * NB + VW, &s1, sizeof(vf));
    }
}

/* int4_tile: mt tokens over ``vectors`` (1 or 2, constants) of an int4 panel's two 16-output
 * vectors, from vector ``first``: the whole panel for one or two tokens, half of it for up to
 * MB_INT4 (20 accumulators). Halves dequantize a row once for ten tokens where the whole panel's
 * tile would for five, and read different words of a block, so the codes are still read once (a
 * panel's zero points and scales twice, from L1). From three tokens halves were faster (4096x4096
 * on a Zen 4, from its caches: 3 tokens 0.61 ms against 0.74 for the whole panel, 4 tokens 0.75
 * against 0.88); tiles of 11 or 12 tokens ran slower than two smaller ones (registers: 11 tokens
 * 2.03 ms against 1.90 for 6 + 5). With these tiles 8 tokens took 1.36 ms (1.94 before: a
 * 6-token and a 2-token tile over the whole panel, dequantizing every row twice), the bfloat16
 * product 1.29. */
#define MB_INT4 10
static inline __attribute__((always_inline)) void int4_tile(const float *x, int64_t ldx, int mt,
                                                            const void *panel, q4_panel qp, int k,
                                                            int first, int vectors, float *out) {
    vf a[MB_INT4][2], c[MB_INT4][2];
    for (int m = 0; m < MB_INT4; m++) a[m][0] = a[m][1] = c[m][0] = c[m][1] = (vf){0};
    for (int i0 = 0; i0 < k; i0 += 8) {
        const int32_t *words = (const int32_t *)panel + i0 / 8 * NB + first * VW;
        vq w[2];
        for (int v = 0; v < vectors; v++) {
            memcpy(&w[v], words + v * VW, sizeof(vq));
            __builtin_prefetch((const char *)(words + v * VW) + PREFETCH_AHEAD, 0, 2);
        }
#pragma GCC unroll 4
        for (int r = 0; r < 8; r += 2) {
            const float *ze = qp.zs + qp.group_at[i0 + r] + first * VW;
            const float *zo = qp.zs + qp.group_at[i0 + r + 1] + first * VW;
            vf we[2], wo[2];
            for (int v = 0; v < vectors; v++) {
                we[v] = int4_weights(w[v], 4 * r, ze + v * VW);
                wo[v] = int4_weights(w[v], 4 * r + 4, zo + v * VW);
            }
            for (int m = 0; m < mt; m++) {
                const vf xe = vsplat(x[m * ldx + i0 + r]), xo = vsplat(x[m * ldx + i0 + r + 1]);
                for (int v = 0; v < vectors; v++) {
                    a[m][v] += xe * we[v];
                    c[m][v] += xo * wo[v];
                }
            }
        }
    }
    for (int m = 0; m < mt; m++)
        for (int v = 0; v < vectors; v++) {
            const vf s = a[m][v] + c[m][v];
            memcpy(out + m * NB + (first + v) * VW, &s, sizeof s);
        }
}

/* The sums (mt <= MB_INT4 tokens x NB, into out) of an int4 panel: one pass of the whole panel's
 * tile for one or two tokens, else half by half. */
static void int4_tokens(const float *x, int64_t ldx, int mt, const void *panel, q4_panel qp, int k,
                        float *out) {
#define INT4_HALVES(T)                                 \
    case T:                                            \
        int4_tile(x, ldx, T, panel, qp, k, 0, 1, out); \
        int4_tile(x, ldx, T, panel, qp, k, 1, 1, out); \
        break;
#if MB_INT4 > 10
#error "int4_tokens: one case per tile size"
#endif
    switch (mt) {
        case 1: int4_tile(x, ldx, 1, panel, qp, k, 0, 2, out); break;
        case 2: int4_tile(x, ldx, 2, panel, qp, k, 0, 2, out); break;
        INT4_HALVES(3) INT4_HALVES(4) INT4_HALVES(5) INT4_HALVES(6) INT4_HALVES(7) INT4_HALVES(8)
        INT4_HALVES(9) INT4_HALVES(10)
        default: break;
    }
#undef INT4_HALVES
}

#else
/* AVX2: 3 tokens x 4 vectors of 8 floats, one chain (k in order): 12 accumulators. */
typedef float pv __attribute__((vector_size(32)));
#define PW 8
#define MB 3
/* Over half-precision weights widened in the tile, 2 tokens a tile: 8 accumulators beside the
 * widened row fit the registers, where 3 tokens need 17 of 16 and gcc kept an accumulator on the
 * stack (measured with bfloat16 weights
 * 6144x768 weight, 2 threads, Zen 3: 90-119 GFLOPS at 3-12 tokens against 68-79 with 3-token
 * tiles). From 64 tokens the panel is widened once instead (matmul_panel) and the float32 tile
 * runs over it: 117-157 GFLOPS at 64-512 tokens against 102-132 for the 2-token tiles, which were
 * faster below (100-145 against 77-112 at 16-32). */
#define MB_HALF 2
#define WIDEN_FROM 64
#define NV (NB / PW) /* product vectors per panel row */

static inline pv pload(const float *p) {
    pv v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline pv psplat(float s) {
    return (pv){s, s, s, s, s, s, s, s};
}

typedef uint32_t pu __attribute__((vector_size(32)));

/* The 32 weights of panel row element at as float32, outputs 0-7, 8-15, 16-23, 24-31 (see wrow:
 * the low halves of a bfloat16 row's first eight words are outputs 0-7, their high halves
 * 16-23). */
static inline __attribute__((always_inline)) void wrow8(const void *panel, int64_t at, int wt,
                                                        pv w[NV]) {
    if (wt == WT_BF16) {
        pu a, b;
        memcpy(&a, (const uint16_t *)panel + at, sizeof a);
        memcpy(&b, (const uint16_t *)panel + at + 2 * PW, sizeof b);
        w[0] = (pv)(a << 16);
        w[1] = (pv)(b << 16);
        w[2] = (pv)(a & HIGH_HALF);
        w[3] = (pv)(b & HIGH_HALF);
    } else if (wt == WT_F16) {
        for (int v = 0; v < NV; v++) w[v] = half8((const uint16_t *)panel + at + v * PW);
    } else {
        for (int v = 0; v < NV; v++) w[v] = pload((const float *)panel + at + v * PW);
    }
}

static inline __attribute__((always_inline)) void panel_tile(const float *x, int64_t ldx, int mt,
                                                             const void *panel, int k, float *out,
                                                             int wt, int stream) {
    /* A single float32 token's rows are not prefetched here, ``stream`` or not: on a Zen 3 (AVX2
     * only) the 125M model's one-token call took 1.037x the time with them (session 25), while
     * this tile built with -mno-avx512f on a Sapphire Rapids Xeon took 0.93-0.945x (session 39;
     * docs/benchmarks.md). The AVX2-only CPUs brisklm has met are AMD's. */
    (void)stream;
    pv acc[MB][NV];
    for (int m = 0; m < MB; m++)
        for (int v = 0; v < NV; v++) acc[m][v] = (pv){0};
    for (int i = 0; i < k; i++) {
        const int64_t at = (int64_t)i * NB;
        const char *row = (const char *)panel + (int64_t)i * ROW_BYTES(wt);
        pv w[NV];
        wrow8(panel, at, wt, w);
        /* As above: the row's lines PREFETCH_AHEAD bytes ahead, into L2. Half-precision rows also
         * for a single token: the loop's iterations each read half the bytes, and the 125M model's
         * step took 0.93x the time with these prefetches (Zen 3, bench/native_kernel_ab.py
         * --dtype bfloat16; twice the distance: 0.98x of that, level within this VM's noise). */
        if (mt > 1 || wt != WT_F32) {
            for (int line = 0; line < NB * WT_SIZE(wt) / 64; line++)
                __builtin_prefetch(row + PREFETCH_AHEAD + 64 * line, 0, 2);
        }
        for (int m = 0; m < mt; m++) {
            const pv xs = psplat(x[m * ldx + i]);
            for (int v = 0; v < NV; v++) acc[m][v] += xs * w[v];
        }
    }
    for (int m = 0; m < mt; m++) memcpy(out + m * NB, acc[m], sizeof acc[m]);
}

/* Int4 tiles (see the AVX-512 int4_tile): k by blocks of eight rows, each row's shift a constant;
 * ``vectors`` (NV, or NV / 2 for half a panel) of a panel's 8-output vectors from ``first``. One
 * or two tokens take the whole panel (two tokens in two passes of halves took 1.25x the time),
 * three or four tokens half a panel each pass: the 32-output tile holds only two tokens beside a
 * dequantized row (MB_HALF), half a row leaves room for four, so the many operations a row of
 * dequantization come once per four tokens. The halves read different lines of a panel's blocks
 * (words 0-15 and 16-31 of each 128), so the codes are still read once. Each output's sum is
 * panel_tile's, the same operations in the same order (one chain, k in order): the same bits. On
 * the Zen 4 (AVX2 code) the blocks of eight took a 4096x4096 product of one token from 0.65 ms to
 * 0.53, 3 tokens from 1.06 to 0.79, 8 from 2.28 to 1.91 (session 60). */
#define MB_INT4 4

/* Outputs 8v..8v+7 of an int4 panel row (see WT_INT4) as float32: the row's codes in the eight
 * words at words + 8v (its block's), shifted by ``shift`` (4 * (row % 8)); z: the row's group
 * block. */
static inline __attribute__((always_inline)) pv int4_vector8(const uint32_t *words, const float *z,
                                                             int shift, int v) {
    typedef int32_t pq __attribute__((vector_size(32)));
    pq c;
    memcpy(&c, words + v * PW, sizeof c);
    return ((pv)(((c >> shift) & 15) | INT4_BIAS_BITS) - pload(z + v * PW)) *
           pload(z + NB + v * PW);
}

static inline __attribute__((always_inline)) void int4_tile(const float *x, int64_t ldx, int mt,
                                                            const void *panel, q4_panel qp, int k,
                                                            int first, int vectors, float *out) {
    pv acc[MB_INT4][NV];
    for (int m = 0; m < MB_INT4; m++)
        for (int v = 0; v < NV; v++) acc[m][v] = (pv){0};
    for (int i0 = 0; i0 < k; i0 += 8) {
        const uint32_t *words = (const uint32_t *)panel + i0 / 8 * NB + first * PW;
        for (int line = 0; line < vectors / 2; line++) /* 64 bytes: two vectors' words */
            __builtin_prefetch((const char *)words + PREFETCH_AHEAD + 64 * line, 0, 2);
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            const float *z = qp.zs + qp.group_at[i0 + r] + first * PW;
            pv w[NV];
            for (int v = 0; v < vectors; v++) w[v] = int4_vector8(words, z, 4 * r, v);
            for (int m = 0; m < mt; m++) {
                const pv xs = psplat(x[m * ldx + i0 + r]);
                for (int v = 0; v < vectors; v++) acc[m][v] += xs * w[v];
            }
        }
    }
    for (int m = 0; m < mt; m++)
        for (int v = 0; v < vectors; v++)
            memcpy(out + m * NB + (first + v) * PW, &acc[m][v], sizeof(pv));
}

/* The sums (mt <= MB_INT4 tokens x NB, into out) of an int4 panel. */
static void int4_tokens(const float *x, int64_t ldx, int mt, const void *panel, q4_panel qp, int k,
                        float *out) {
    switch (mt) {
        case 1: int4_tile(x, ldx, 1, panel, qp, k, 0, NV, out); break;
        case 2: int4_tile(x, ldx, 2, panel, qp, k, 0, NV, out); break;
        case 3:
            int4_tile(x, ldx, 3, panel, qp, k, 0, NV / 2, out);
            int4_tile(x, ldx, 3, panel, qp, k, NV / 2, NV / 2, out);
            break;
        default:
            int4_tile(x, ldx, 4, panel, qp, k, 0, NV / 2, out);
            int4_tile(x, ldx, 4, panel, qp, k, NV / 2, NV / 2, out);
            break;
    }
}
#endif

#define PANEL_CASE(T, WT) \
    case T: panel_tile(x, ldx, T, panel, k, out, WT, stream); break;

#if MB == 6
#define PANEL_SWITCH(WT)                                                                          \
    switch (mt) {                                                                                 \
        PANEL_CASE(1, WT) PANEL_CASE(2, WT) PANEL_CASE(3, WT) PANEL_CASE(4, WT) PANEL_CASE(5, WT) \
        PANEL_CASE(6, WT) default: break;                                                         \
    }
#elif MB == 3
#define PANEL_SWITCH(WT) \
    switch (mt) { PANEL_CASE(1, WT) PANEL_CASE(2, WT) PANEL_CASE(3, WT) default: break; }
#else
#error "panel_tokens: no cases for this MB"
#endif

/* The sums of a float32 or half-precision panel (int4 panels: int4_tokens). */
static void panel_tokens(const float *x, int64_t ldx, int mt, const void *panel, int k,
                         float *out, int wt, int stream) {
    if (wt == WT_BF16) {
        PANEL_SWITCH(WT_BF16)
    } else if (wt == WT_F16) {
        PANEL_SWITCH(WT_F16)
    } else {
        PANEL_SWITCH(WT_F32)
    }
}

#define MAX_TEAM 256 /* threads a parallel region is given at most (one team_slot each) */

/* One thread's share of a product's panels: [next, end) in one word (next << 32 | end), on a
 * cache line of its own. The owner takes panels from the front; a thread done with its own share
 * takes them from the back of another's. With a static split, a core that streamed slower (5-6%
 * in some runs on the AVX2 Zen 3, as on the AVX-512 VM in session 16) held the other at every
 * product's barrier; shared out this way, the threads finish together. Which thread computes a
 * panel does not change its bits. */
typedef struct {
    uint64_t range;
} __attribute__((aligned(64))) team_slot;

/* The barrier between a parallel region's phases, in place of OpenMP's: a thread that arrives
 * before the others spins for up to TEAM_SPINS pauses (50 us on a Zen 4), then sleeps (a futex
 * on Linux, else it yields its core) until the last one arrives. libgomp's barrier spins far
 * longer before it sleeps (GOMP_SPINCOUNT: 300,000 by default), which on a machine busy with
 * other work makes a barrier wait for a preempted teammate while its own core spins. Session 61,
 * Zen 4, 2 vCPUs, bench/native_kernel_ab.py: the bundled model's one-token step (8 layers, 75
 * barriers, 77 with the greedy argmax) took 0.21-0.38x the time with two busy processes beside
 * it (six tokens 0.86-1.13x, the 125M model 0.98-1.14x: noise), and as long on an idle machine
 * (1.01x / 0.97x at one / six tokens; the 125M model 0.95x / 0.93x at one / eight, 1.01x /
 * 1.02x at 3,000 positions).
 * Shorter spins cost idle machines: 200 pauses 1.15-1.23x the time, none 1.9-2.4x. ``phase``
 * counts the barriers passed; zeroed before the parallel region, as the slots are. */
#define TEAM_SPINS 2000
typedef struct {
    int arrived;  /* threads at the current barrier */
    int phase;    /* barriers passed (the futex word) */
    int sleepers; /* threads asleep on phase, or about to be */
} __attribute__((aligned(64))) team_sync;

static inline void cpu_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Tests only: the thread of this number starts every phase after a barrier 300 us late, so that
 * the others reach the next barrier first and sleep there (and are woken), and a barrier missing
 * between two phases shows as a wrong result, whatever the timing. -1: none. */
int brisk_test_late_thread = -1;

static void late_start(void) {
    if (__builtin_expect(brisk_test_late_thread == THREAD_NUM(), 0)) {
        const struct timespec late = {0, 300000};
        nanosleep(&late, NULL);
    }
}

/* Nanoseconds threads have slept at barriers, waiting for a teammate late past the spin: a
 * small part of a pass on an idle machine, most of it where other work preempts a teammate
 * (brisklm.models.native_forward's TeamSize reads it). */
int64_t brisk_barrier_sleep_ns = 0;

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Arrives at the barrier and returns once all ``team`` threads have. */
static void team_wait(team_sync *s, int team) {
    const int phase = __atomic_load_n(&s->phase, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&s->arrived, 1, __ATOMIC_ACQ_REL) == team) {
        __atomic_store_n(&s->arrived, 0, __ATOMIC_RELAXED);
        /* Sequentially consistent with the sleepers' count: either a sleeper counted itself before
         * this load (and is woken; its futex wait returns at once if it has not begun) or it sees
         * the new phase before it sleeps. */
        __atomic_store_n(&s->phase, phase + 1, __ATOMIC_SEQ_CST);
#if defined(__linux__)
        if (__atomic_load_n(&s->sleepers, __ATOMIC_SEQ_CST) > 0)
            syscall(SYS_futex, &s->phase, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#endif
        return;
    }
    for (int spin = 0; spin < TEAM_SPINS; spin++) {
        if (__atomic_load_n(&s->phase, __ATOMIC_ACQUIRE) != phase) return;
        cpu_pause();
    }
    const int64_t asleep = now_ns();
    __atomic_add_fetch(&s->sleepers, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&s->phase, __ATOMIC_SEQ_CST) == phase) {
#if defined(__linux__)
        syscall(SYS_futex, &s->phase, FUTEX_WAIT_PRIVATE, phase, NULL, NULL, 0);
#else
        sched_yield();
#endif
    }
    __atomic_sub_fetch(&s->sleepers, 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&brisk_barrier_sleep_ns, now_ns() - asleep, __ATOMIC_RELAXED);
}

static void team_barrier(team_sync *s) {
    const int team = TEAM_SIZE();
    if (team < 2) return;
    team_wait(s, team);
    late_start();
}

/* The first of up to ``want`` consecutive panels taken from the front (or the back) of share s,
 * their number in *got; -1 when the share is empty. */
static inline int take_panel(team_slot *s, int from_back, int want, int *got) {
    uint64_t cur = __atomic_load_n(&s->range, __ATOMIC_ACQUIRE);
    for (;;) {
        const uint32_t next = (uint32_t)(cur >> 32), end = (uint32_t)cur;
        if (next >= end) return -1;
        const uint32_t count = end - next < (uint32_t)want ? end - next : (uint32_t)want;
        const uint64_t want_range = from_back ? ((uint64_t)next << 32) | (end - count)
                                              : ((uint64_t)(next + count) << 32) | end;
        if (__atomic_compare_exchange_n(&s->range, &cur, want_range, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            *got = (int)count;
            return (int)(from_back ? end - count : next);
        }
    }
}

/* Each thread's buffer for a widened half-precision or int4 panel (grown as needed, kept for the
 * next call), freed when the thread exits (a pthread key's destructor): OpenMP's worker threads end
 * with the thread that started their pool, and the engine's thread exits whenever it has been idle
 * for a second, so buffers kept only in thread-local variables would leak at every restart. */
static __thread float *wide_buffer = NULL;
static __thread size_t wide_floats = 0;
static pthread_key_t wide_key;
static int wide_key_made = 0; /* 0 if the process had no key left: the buffers then stay */
static pthread_once_t wide_key_once = PTHREAD_ONCE_INIT;

/* Tests only: how many threads' buffers are allocated now (exact, where resident memory depends
 * on the allocator's arenas and on whatever else the process does). */
int brisk_test_wide_buffers = 0;

static void wide_buffer_free(void *buffer) {
    free(buffer);
    __atomic_sub_fetch(&brisk_test_wide_buffers, 1, __ATOMIC_RELAXED);
}

static void wide_key_create(void) {
    wide_key_made = pthread_key_create(&wide_key, wide_buffer_free) == 0;
}

/* The half-precision or int4 panel (of type wt) of k rows as a float32 panel (outputs in order,
 * as pack lays out float32) in this thread's buffer; NULL if it cannot be allocated. */
static const float *widened_panel(const void *panel, q4_panel qp, int k, int wt) {
    const size_t need = (size_t)k * NB;
    if (need > wide_floats) {
        if (wide_buffer) wide_buffer_free(wide_buffer);
        wide_buffer = aligned_alloc(64, (need * sizeof(float) + 63) / 64 * 64);
        wide_floats = wide_buffer ? need : 0;
        if (wide_buffer) __atomic_add_fetch(&brisk_test_wide_buffers, 1, __ATOMIC_RELAXED);
        pthread_once(&wide_key_once, wide_key_create);
        if (wide_key_made) pthread_setspecific(wide_key, wide_buffer);
        if (!wide_buffer) return NULL;
    }
    for (int i = 0; i < k; i++) {
        vf lo, hi;
        if (wt == WT_INT4)
            int4_row(panel, i, qp, &lo, &hi);
        else if (wt == WT_F16)
            wrow(panel, (int64_t)i * NB, WT_F16, &lo, &hi);
        else
            wrow(panel, (int64_t)i * NB, WT_BF16, &lo, &hi);
        memcpy(wide_buffer + (int64_t)i * NB, &lo, sizeof lo);
        memcpy(wide_buffer + (int64_t)i * NB + VW, &hi, sizeof hi);
    }
    return wide_buffer;
}

/* Row dst of y gets the panel's width outputs from out (+ the bias's b[o...]), or adds them. */
static inline __attribute__((always_inline)) void store_panel(const float *restrict out,
                                                              const float *restrict b, int o,
                                                              int width, float *restrict dst,
                                                              int accumulate) {
    for (int c = 0; c < width; c++) {
        const float v = b ? out[c] + b[o + c] : out[c];
        dst[c] = accumulate ? dst[c] + v : v;
    }
}

/* Panel p of a packed weight (for int4, ``packed`` is its q4_weight), and for int4 its blocks. */
static inline __attribute__((always_inline)) const void *panel_at(const void *packed, int wt,
                                                                  int k, int p, q4_panel *qp) {
    if (wt == WT_INT4) {
        const q4_weight *q = (const q4_weight *)packed;
        qp->zs = q->zs + (int64_t)p * q->zs_panel;
        qp->group_at = q->group_at;
        return q->codes + (int64_t)p * PANEL_BYTES(k, wt);
    }
    qp->zs = NULL;
    qp->group_at = NULL;
    return (const char *)packed + (int64_t)p * PANEL_BYTES(k, wt);
}

/* Int4 panels, whose tiles dequantize each row once per tile (int4_tile), are widened from this
 * many tokens with both tiles. The 4096x4096 product on a Zen 4 (from its caches), in tiles /
 * widened: AVX-512 4.1-4.4 / 4.1-4.5 ms at 24 tokens, 5.5-5.6 / 5.4-6.0 at 32, 7.3 / 7.0 at 40,
 * 10.4 / 7.9 at 48 and 11.7 / 10.2 at 64 (the bfloat16 product 9.9); the AVX2 code on one thread
 * 8.3 / 9.3 at 16, 11.4 / 11.4 at 24, 15.0 / 13.9-14.3 at 32, 22.5 / 18.3-19.1 at 48. */
#define WIDEN_INT4_FROM 32

/* Outputs [o, o + NB) of y for panel p (see matmul_team). */
static void matmul_panel(const float *x, int64_t ldx, int n, int k, const void *packed, int wt,
                         const float *b, int rows, float *y, int64_t ldy, int accumulate, int p,
                         int stream) {
    q4_panel qp;
    const void *panel = panel_at(packed, wt, k, p, &qp);
    const int o = p * NB, width = rows - o < NB ? rows - o : NB;
    /* Many tokens (WIDEN_FROM, WIDEN_INT4_FROM): widen the half-precision or int4 panel once and
     * run every tile over the float32 copy, as a float32 weight, instead of widening it again in
     * every tile (the AVX2 tile over half-precision weights also takes only MB_HALF tokens: see
     * its definition). Same products, same order: the bits of the tile over the half-precision
     * panel, so a row's result does not depend on which way its call went. */
    const int widen_from = wt == WT_INT4 ? WIDEN_INT4_FROM : WIDEN_FROM;
    if (widen_from > 0 && wt != WT_F32 && n >= widen_from) {
        const float *wide = widened_panel(panel, qp, k, wt);
        if (wide) {
            panel = wide;
            wt = WT_F32;
        }
    }
    if (wt == WT_INT4) { /* tiles of balanced sizes: 12 tokens as 6 + 6, not 10 + 2 */
        if (n < 1) return; /* no rows (the head in a pass that wants no logits) */
        float sums[MB_INT4 * NB];
        const int tiles = (n + MB_INT4 - 1) / MB_INT4, tile = (n + tiles - 1) / tiles;
        for (int m0 = 0; m0 < n; m0 += tile) {
            const int mt = n - m0 < tile ? n - m0 : tile;
            int4_tokens(x + m0 * ldx, ldx, mt, panel, qp, k, sums);
            for (int m = 0; m < mt; m++)
                store_panel(sums + m * NB, b, o, width, y + (m0 + m) * ldy + o, accumulate);
        }
        return;
    }
    float out[MB * NB];
    const int tile = wt == WT_F32 ? MB : MB_HALF;
    for (int m0 = 0; m0 < n; m0 += tile) {
        const int mt = n - m0 < tile ? n - m0 : tile;
        panel_tokens(x + m0 * ldx, ldx, mt, panel, k, out, wt, stream);
        for (int m = 0; m < mt; m++)
            store_panel(out + m * NB, b, o, width, y + (m0 + m) * ldy + o, accumulate);
    }
}

#ifndef GROUP
/* The AVX2 tile reads one panel at a time: a single token's sums of one panel take four of its
 * sixteen registers, so four panels would leave none for the weights (not measured: no AVX2-only
 * CPU at hand when panel_group was written). */
#define GROUP 1
#endif

/* Panels [p, p + count) (see matmul_panel); a single token reads up to GROUP of them at once. */
static void matmul_panels(const float *x, int64_t ldx, int n, int k, const void *packed, int wt,
                          const float *b, int rows, float *y, int64_t ldy, int accumulate, int p,
                          int count, int stream) {
#if GROUP > 1
    if (n == 1 && count > 1) {
        q4_panel qp;
        const void *panel = panel_at(packed, wt, k, p, &qp);
        const int64_t panel_elems = (int64_t)k * NB;
        const int64_t zs_panel = wt == WT_INT4 ? ((const q4_weight *)packed)->zs_panel : 0;
        float out[GROUP * NB];
        /* g a constant in every call (see panel_group) */
#define GROUP_CASE(G)                                                        \
    case G:                                                                  \
        if (wt == WT_INT4)                                                   \
            int4_group(x, panel, qp, zs_panel, G, k, out);                   \
        else if (wt == WT_BF16)                                              \
            panel_group(x, panel, panel_elems, G, k, out, WT_BF16);          \
        else if (wt == WT_F16)                                               \
            panel_group(x, panel, panel_elems, G, k, out, WT_F16);           \
        else                                                                 \
            panel_group(x, panel, panel_elems, G, k, out, WT_F32);           \
        break;
#if GROUP != 4
#error "matmul_panels: one case per panel count"
#endif
        switch (count) {
            GROUP_CASE(2)
            GROUP_CASE(3)
            GROUP_CASE(4)
            default: /* not reached: count is 2..GROUP here */
                for (int j = 0; j < count; j++)
                    matmul_panel(x, ldx, n, k, packed, wt, b, rows, y, ldy, accumulate, p + j,
                                 stream);
                return;
        }
#undef GROUP_CASE
        for (int j = 0; j < count; j++) {
            const int o = (p + j) * NB;
            store_panel(out + j * NB, b, o, rows - o < NB ? rows - o : NB, y + o, accumulate);
        }
        return;
    }
#endif
    for (int j = 0; j < count; j++)
        matmul_panel(x, ldx, n, k, packed, wt, b, rows, y, ldy, accumulate, p + j, stream);
}

/* Tests only: the thread of this number leaves its own share to the others (so that taking from
 * the back of a share is exercised whatever the timing). -1: none. */
int brisk_test_idle_share = -1;

/* Outputs [0, rows) of y (n x rows, row stride ldy) = x (n x k) @ W.T (+ b) for W packed in
 * panels, the panels shared out across the team (slots: one per thread, zeroed before the
 * parallel region); accumulate: add to y instead of storing. Must be called by every thread of
 * the team; ends with a barrier, so a slot is never reset while another thread still takes from
 * it. A thread that looks at a slot its owner has not yet reset for this product finds it empty
 * (every product empties all of them) and leaves those panels to the owner. A single token takes
 * up to GROUP panels of its own share at a time (panel_group, int4_group); taken from another's,
 * one. */
static void matmul_team(const float *x, int64_t ldx, int n, int k, const void *packed, int wt,
                        const float *b, int rows, float *y, int64_t ldy, int accumulate,
                        team_slot *slots, team_sync *sync, int stream) {
    const int panels = (rows + NB - 1) / NB, team = TEAM_SIZE(), tid = THREAD_NUM();
    const uint64_t lo = (uint64_t)panels * tid / team, hi = (uint64_t)panels * (tid + 1) / team;
    __atomic_store_n(&slots[tid].range, lo << 32 | hi, __ATOMIC_RELEASE);
    const int takes_own = tid != brisk_test_idle_share; /* read once, not per panel */
    const int want = n == 1 ? GROUP : 1;
    int p, got;
    while (takes_own && (p = take_panel(&slots[tid], 0, want, &got)) >= 0)
        matmul_panels(x, ldx, n, k, packed, wt, b, rows, y, ldy, accumulate, p, got, stream);
    for (int j = 1; j <= team; j++) /* the others', then anything left of its own */
        while ((p = take_panel(&slots[(tid + j) % team], 1, 1, &got)) >= 0)
            matmul_panels(x, ldx, n, k, packed, wt, b, rows, y, ldy, accumulate, p, got, stream);
    team_barrier(sync);
}

/* exp(x) in float32 for 16 lanes, without branches or calls (libm's expf is a call per element:
 * at 2,000 keys it was the largest part of attention). Cephes' expf: x = n ln2 + r with |r| <=
 * ln2 / 2, a degree-6 polynomial for exp(r), 2^n through the exponent bits; about 1 ulp. For x <= 0
 * (softmax): below -87.3 it returns ~1e-38 instead of a denormal or 0. Written on vectors: the same
 * function on scalars, in a loop, was left scalar by gcc 12 (it copied the code after the clamp
 * into the clamped branch, where it folds to constants, and then found control flow in the loop),
 * and attention's softmax took 14% of a six-token step at 3,000 positions. */
/* Vectors of the registers' width for these: gcc lowers comparisons of vectors wider than the
 * registers lane by lane (with branches), so with AVX2 they take 8 floats, not vf's 16. */
#if defined(__AVX512F__)
#define EW 16
#else
#define EW 8
#endif
typedef float ev __attribute__((vector_size(EW * 4)));
typedef int32_t evi __attribute__((vector_size(EW * 4))); /* ev's lanes as integers, or masks */

static inline ev ev_splat(float s) {
    ev v;
    for (int i = 0; i < EW; i++) v[i] = s;
    return v;
}

static inline ev ev_load(const float *p) {
    ev v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline ev ev_select(evi mask, ev a, ev b) { /* a where mask, else b */
    return (ev)(((evi)a & mask) | ((evi)b & ~mask));
}

static inline ev vexp_nonpositive(ev x) {
    x = ev_select((evi)(x < ev_splat(-87.0f)), ev_splat(-87.0f), x);
    /* n = x / ln2 rounded to the nearest integer by adding and subtracting 1.5 * 2^23. */
    const ev n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    ev r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    ev poly = ev_splat(1.9875691500e-4f);
    poly = poly * r + 1.3981999507e-3f;
    poly = poly * r + 8.3334519073e-3f;
    poly = poly * r + 4.1665795894e-2f;
    poly = poly * r + 1.6666665459e-1f;
    poly = poly * r + 5.0000001201e-1f;
    const ev y = poly * r * r + r + 1.0f;
    return y * (ev)((__builtin_convertvector(n, evi) + 127) << 23);
}

/* SiLU, g * sigmoid(g), through exp(-|g|) so that vexp_nonpositive serves both signs. */
static inline ev vsilu(ev g) {
    const evi negative = (evi)(g < ev_splat(0.0f));
    /* Below -87 vexp_nonpositive stops at ~1e-38; the product would then grow with |g|. */
    const ev e = (ev)((evi)vexp_nonpositive(ev_select(negative, g, -g)) &
                      ~(evi)(g < ev_splat(-87.0f)));
    return ev_select(negative, g * e, g) / (1.0f + e);
}

/* act = silu(gate) * up over n outputs, EW at a time (the last ones in a padded vector). */
#define SILU_CHUNK 512
static void silu_mul(const float *restrict gate, const float *restrict up, float *restrict act,
                     int n) {
    int o = 0;
    for (; o + EW <= n; o += EW) {
        const ev out = vsilu(ev_load(gate + o)) * ev_load(up + o);
        memcpy(act + o, &out, sizeof out);
    }
    if (o < n) {
        ev g = {0}, u = {0};
        memcpy(&g, gate + o, sizeof(float) * (n - o));
        memcpy(&u, up + o, sizeof(float) * (n - o));
        const ev out = vsilu(g) * u;
        memcpy(act + o, &out, sizeof(float) * (n - o));
    }
}

/* Largest head_dim whose output row stays in registers during the weighted sum of values. */
#define MAX_REG_DIM (8 * VW)

static void rms_norm(const float *x, const float *w, int e, float eps, float *out) {
    vf acc = {0};
    int i = 0;
    for (; i + VW <= e; i += VW) {
        vf v = vload(x + i);
        acc += v * v;
    }
    float s = vsum(acc);
    for (; i < e; i++) s += x[i] * x[i];
    float r = 1.0f / sqrtf(s / (float)e + eps);
    for (i = 0; i < e; i++) out[i] = (x[i] * r) * w[i];
}

typedef struct {
    int n_tokens, n_layers, hidden, n_heads, n_kv_heads, head_dim, inter, vocab;
    int n_logits, n_threads;
    int64_t max_seq_len;
    float eps, scale;
    const int64_t *token_ids, *slots, *positions, *logit_tokens, *rope_rows;
    const void *embed;       /* the embedding table, of weight_type */
    const float *cos, *sin; /* rows of head_dim; token t uses row rope_rows[t] */
    float *hidden_states, *xn, *qkv, *attn, *gate_up, *act, *scores, *normed, *logits;
    /* In this order (native.ForwardArgs mirrors it); the products' weights packed, of
     * weight_type. */
    const float **in_norm;
    const void **qkv_w;
    const float **qkv_b;
    const void **o_w;
    const float **o_b, **post_norm;
    const void **gu_w;
    const float **gu_b;
    const void **down_w;
    const float **down_b;
    void **k_cache, **v_cache; /* of cache_type */
    const int *window;
    const float *final_norm;
    const void *head_w; /* packed, of head_type */
    int weight_type;    /* WT_F32, WT_BF16 or WT_F16: the embedding table's elements */
    int cache_type;     /* the same codes: the KV cache's elements */
    /* With argmax_cols > 0, argmax[r] = logits row r's greedy token over its first argmax_cols
     * logits (see team_argmax); 0: none. */
    int argmax_cols;
    int64_t *argmax;
    /* The types of the layers' products' weights, four a layer (qkv_w, o_w, gu_w, down_w), and
     * of the head's: WT_F32, WT_BF16, WT_F16 or WT_INT4 (each such weight then a q4_weight). */
    const int *layer_types;
    int head_type;
    /* n_steps > 1, step_uniforms, logit adjustments (n_bias, repetition, frequency below) or
     * step_logits: decoding for n_steps passes in one call (brisk_forward_f32). Every token then
     * has its logits (one token a row), argmax_cols > 0, rope_rows is positions, and step_tokens
     * (n_steps x n_tokens) gets each pass's tokens; each later pass feeds the last one's tokens one
     * position on. Else one pass. A row's token is its greedy one, or, with step_uniforms and
     * sampled_rows[r] set, the draw of brisk_sample_rows from its logits (those past
     * argmax_cols -inf) with temperature[r], top_k[r], top_p[r], min_p[r] and the uniform
     * step_uniforms[step * n_tokens + r]. A row with nothing to draw ends the call before that
     * step's tokens are kept; steps_done gets the steps whose tokens are in step_tokens. */
    int n_steps;
    int64_t *step_tokens;
    const double *step_uniforms;
    const uint8_t *sampled_rows;
    const float *temperature;
    const int64_t *top_k;
    const float *top_p;
    const float *min_p;
    int *steps_done;
    /* Qwen3: per layer, the RMSNorm weights (head_dim) over each query head and each key head,
     * applied before the rotation; NULL: none. */
    const float **q_norm, **k_norm;
    /* Logit bias and penalties on logits row r before its token is chosen (adjust_logits_row):
     * n_bias entries (bias_rows[i], bias_ids[i], bias_values[i]); repetition[r] (NULL: none)
     * over the tokens seen (n_logits x vocab, nonzero where row r's prompt or output holds the
     * token); frequency[r] and presence[r] (NULL: none) by counts (n_logits x vocab, row r's
     * output tokens). Only in stepping calls (any of them makes a call one), which count each
     * step's tokens in seen and counts (where given) before the next step. */
    int64_t n_bias;
    const int64_t *bias_rows, *bias_ids;
    const float *bias_values;
    const float *repetition;
    uint8_t *seen;
    const float *frequency, *presence;
    float *counts;
    /* Stepping calls (a non-NULL step_logits makes a call one): each step's raw logits (n_steps x
     * n_logits x vocab), copied before a bias, penalties or the sampling's masks touch them, for
     * the caller's logprobs. */
    float *step_logits;
} brisk_forward_args;

/* Row id of the embedding table (of type wt, e wide) as float32. Not inlined, so that the float16
 * widening loops stay out of the forward pass's parallel region (inlined, they grew its code by a
 * third and changed its register allocation; a once-per-token copy gains nothing from inlining). */
static __attribute__((noinline)) void embedding_row(const void *table, int wt, int64_t id, int e,
                                                    float *row) {
    if (wt == WT_F32) {
        memcpy(row, (const float *)table + id * e, sizeof(float) * e);
        return;
    }
    const uint16_t *src = (const uint16_t *)table + id * e;
    int i = 0;
    if (wt == WT_F16) {
        for (; i + 8 <= e; i += 8) {
            const v8f wide = half8(src + i);
            memcpy(row + i, &wide, sizeof wide);
        }
        for (; i < e; i++) row[i] = half_to_float(src[i]);
    } else {
        for (; i < e; i++) {
            const uint32_t bits = (uint32_t)src[i] << 16;
            memcpy(row + i, &bits, sizeof(float));
        }
    }
}

static void rope(float *x, const float *c, const float *s, int d) {
    int half = d / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * c[i] - b * s[i];
        x[i + half] = b * c[i + half] + a * s[i + half];
    }
}

/* A bfloat16 cache read in pairs: twice a vector's lanes of elements as one vector of 32-bit words
 * (8 with AVX2, 16 with AVX-512: pair_lanes in attend_unit), each word's low half an even element
 * and its high half the odd one after it, so that a shift and a mask widen them where zero
 * extension and a shift take two operations for every vector. At 3,000 positions six-token rows
 * over a bfloat16 cache took 1.15-1.22x the time of rows over a float32 one with AVX2 before the
 * pairs (0.80x after), and 0.95x with AVX-512 (0.83x after; docs/benchmarks.md). Heads of a
 * multiple of 2 * pair_lanes elements, up to PAIRED_DIM. */
#define PAIRED_DIM 512

/* q's elements in the order the paired keys are widened: for each 2 * lanes, the lanes even ones
 * then the lanes odd ones. */
static inline void pair_query(const float *q, int d, float *qp, int lanes) {
    for (int i = 0; i < d; i += 2 * lanes)
        for (int m = 0; m < lanes; m++) {
            qp[i + m] = q[i + 2 * m];
            qp[i + lanes + m] = q[i + 2 * m + 1];
        }
}

#if defined(HAVE_SHUFFLEVECTOR) && !defined(__AVX512F__)
/* Attention with AVX2 (16 registers of 8 floats), where the 16-float vectors above take two
 * registers each: the 4-key scores kept each key's 16-float accumulator on the stack and summed
 * its lanes through stores and reloads (store-forwarding stalls: most of attention's samples in
 * perf), and the values' 16 accumulators of 16 floats spilled. Here scores take 8 keys at a time
 * in 8 accumulators of 8 floats, summed by one shuffle tree, and values 64 outputs at a time in 8
 * accumulators. Every key's score and every output is computed by the same instructions wherever
 * it falls (a short last block repeats a valid key and drops its score), so the result does not
 * depend on the row's length or its batch. Both read their streams without software prefetches
 * (with them: level or up to 5% slower, A/B at 160-3,000 positions). bench/native_kernel_ab.py on
 * a Zen 3, 125M model: one token 22.2 -> 21.5 ms at 160 positions, 29.2 -> 25.2 at 1,000; six
 * tokens 35.6 -> 31.6 and 67.1 -> 40.6 ms; bundled model at 3,000: 9.4 -> 7.8 ms (one token). */
#define AVX2_ATTENTION 1
#define VALUE_BLOCK 64 /* outputs per pass over the values */

/* The lane sums of 8 vectors as one vector (lane r: v[r]'s lanes summed as
 * ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))). */
static inline pv lane_sums8(const pv v[8]) {
    pv w[4], x[2];
    for (int k = 0; k < 4; k++)
        w[k] = SHUF(v[2 * k], v[2 * k + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
               SHUF(v[2 * k], v[2 * k + 1], 4, 5, 6, 7, 12, 13, 14, 15);
    for (int k = 0; k < 2; k++) /* lanes: keys 4k, 4k + 2, 4k + 1, 4k + 3, two partial sums each */
        x[k] = SHUF(w[2 * k], w[2 * k + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
               SHUF(w[2 * k], w[2 * k + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    const pv z = SHUF(x[0], x[1], 0, 2, 4, 6, 8, 10, 12, 14) +
                 SHUF(x[0], x[1], 1, 3, 5, 7, 9, 11, 13, 15); /* keys 0 2 1 3 4 6 5 7 */
    return SHUF(z, z, 0, 2, 1, 3, 4, 6, 5, 7);
}

static inline pv pv_max(pv a, pv b) {
    typedef int32_t pvi __attribute__((vector_size(32)));
    const pvi take_a = (pvi)(a > b);
    return (pv)(((pvi)a & take_a) | ((pvi)b & ~take_a));
}

/* Eight cache elements from element i as float32. */
static inline __attribute__((always_inline)) pv cload8(const void *base, int64_t i, int ct) {
    if (ct == WT_BF16) {
        typedef uint16_t v8u16 __attribute__((vector_size(16)));
        v8u16 h;
        memcpy(&h, (const uint16_t *)base + i, sizeof h);
        return (pv)(__builtin_convertvector(h, pu) << 16);
    }
    if (ct == WT_F16) return half8((const uint16_t *)base + i);
    return pload((const float *)base + i);
}

/* keys[r] . q for the 8 keys r < 8 spaced d apart (d a multiple of PW); keys at r >= valid are
 * not read: key valid - 1 is computed in their place. */
static inline __attribute__((always_inline)) pv dot8_keys(const void *keys, int valid,
                                                          const float *q, int d, int ct) {
    int64_t k[8];
    for (int r = 0; r < 8; r++) k[r] = (int64_t)(r < valid ? r : valid - 1) * d;
    pv acc[8];
    for (int r = 0; r < 8; r++) acc[r] = (pv){0};
    for (int i = 0; i < d; i += PW) {
        const pv qv = pload(q + i);
        for (int r = 0; r < 8; r++) acc[r] += cload8(keys, k[r] + i, ct) * qv;
    }
    return lane_sums8(acc);
}

/* acc[0, VALUE_BLOCK) += sum_j p[j] v_j over count rows v_j spaced d apart, in key order, the sums
 * kept in registers over the rows (acc holds the sums of the keys before: 0 at first). */
static inline __attribute__((always_inline)) void weighted_values64(
    const float *p, const void *v, int64_t count, int d, float *acc_mem, int ct) {
    pv acc[VALUE_BLOCK / PW];
    for (int c = 0; c < VALUE_BLOCK / PW; c++) acc[c] = pload(acc_mem + c * PW);
    for (int64_t j = 0; j < count; j++) {
        const pv ps = psplat(p[j]);
        for (int c = 0; c < VALUE_BLOCK / PW; c++) acc[c] += ps * cload8(v, j * d + c * PW, ct);
    }
    for (int c = 0; c < VALUE_BLOCK / PW; c++) memcpy(acc_mem + c * PW, &acc[c], sizeof acc[c]);
}

/* dot8_keys over a bfloat16 cache, q paired (pair_query): per 16 elements the even products,
 * then the odd ones, into each key's accumulator. */
static inline __attribute__((always_inline)) pv dot8_keys_paired(const void *keys, int valid,
                                                                 const float *qp, int d) {
    int64_t k[8];
    for (int r = 0; r < 8; r++) k[r] = (int64_t)(r < valid ? r : valid - 1) * d;
    pv acc[8];
    for (int r = 0; r < 8; r++) acc[r] = (pv){0};
    for (int i = 0; i < d; i += 16) {
        const pv qe = pload(qp + i), qo = pload(qp + i + 8);
        for (int r = 0; r < 8; r++) {
            pu w;
            memcpy(&w, (const uint16_t *)keys + k[r] + i, sizeof w);
            acc[r] += (pv)(w << 16) * qe;
            acc[r] += (pv)(w & HIGH_HALF) * qo;
        }
    }
    return lane_sums8(acc);
}

/* weighted_values64 over a bfloat16 cache read in pairs: each output is the same sum, in the same
 * order (the bits of weighted_values64), kept as even and odd outputs: for each 16 outputs, the 8
 * even ones' sums then the 8 odd ones' in acc (finish_query interleaves them). */
static inline void weighted_values64_paired(const float *p, const void *v, int64_t count, int d,
                                            float *acc_mem) {
    pv even[VALUE_BLOCK / 16], odd[VALUE_BLOCK / 16];
    for (int c = 0; c < VALUE_BLOCK / 16; c++) {
        even[c] = pload(acc_mem + c * 16);
        odd[c] = pload(acc_mem + c * 16 + PW);
    }
    for (int64_t j = 0; j < count; j++) {
        const pv ps = psplat(p[j]);
        for (int c = 0; c < VALUE_BLOCK / 16; c++) {
            pu w;
            memcpy(&w, (const uint16_t *)v + j * d + c * 16, sizeof w);
            even[c] += ps * (pv)(w << 16);
            odd[c] += ps * (pv)(w & HIGH_HALF);
        }
    }
    for (int c = 0; c < VALUE_BLOCK / 16; c++) {
        memcpy(acc_mem + c * 16, &even[c], sizeof even[c]);
        memcpy(acc_mem + c * 16 + PW, &odd[c], sizeof odd[c]);
    }
}
#endif

/* Attention runs in units: the queries of one KV group that read the same keys (heads h0 to h1 of
 * the group, for tokens t0 to t1 of one row at one cache slot: a multi-token row's tokens, and the
 * heads that share a KV head) are computed together, a tile of keys at a time. The first query
 * reads a tile from memory and the others from L1, where attending query by query read every key
 * and value once per query (six tokens of a GQA 12/4 model: 18 times). Each query's scores, its
 * softmax and its weighted sums are computed by the instructions, and in the order, that it takes
 * alone: a query's result does not depend on its unit, the tiles or the thread. */
#define UNIT_QUERIES 16  /* queries per unit at most */
#define TILE_BYTES 16384 /* of keys (then values) per tile: half of a Zen 3's or Skylake's L1 */
/* A unit whose keys take at most these bytes asks for all its keys (into L1) and values (into
 * L2) before it reads any: between the products, whose weights have pushed them out of every
 * cache, a short stream of keys was read at the latency of each access before the hardware
 * prefetchers took it up. A Zen 4, the 125M model's one-token step at 160 positions (40 KB of
 * keys a unit), attention's time in the step: 170 us against 220 (values_add took it from 240 to
 * 220); the step, 7 ms, level within this VM's noise. Longer caches are left to the hardware
 * prefetchers (see PREFETCH_AHEAD). */
#define ASK_KEYS_BYTES 262144

typedef struct {
    int t0, t1, h0, h1;
} attn_unit;

/* Floats of the scratch space per query: scores over the whole cache, then d + VW floats that
 * hold the paired query (while scoring) and the value sums' second chain and tail (while
 * summing). A thread's space is UNIT_QUERIES of these (brisk_attention_floats). */
#define QUERY_SPACE(a) ((a)->max_seq_len + (a)->head_dim + VW)

/* Thread tid's attention scratch in a->scores. */
static float *thread_space(const brisk_forward_args *a, int tid) {
    return a->scores + (int64_t)tid * UNIT_QUERIES * QUERY_SPACE(a);
}

#if defined(HAVE_SHUFFLEVECTOR) && defined(__AVX512F__)
#define AVX512_ATTENTION 1
typedef vf top_vec;
#define TOP_INIT vsplat(-INFINITY)
#elif defined(AVX2_ATTENTION)
typedef pv top_vec;
#define TOP_INIT psplat(-INFINITY)
#endif

/* One query of a unit: token n's head h. */
typedef struct {
    const float *q; /* paired (pair_query) where the cache is read in pairs */
    float *scores;  /* scores[j - lo]: key j's score, then its softmax weight (unnormalised) */
    float *extra;   /* the d + VW floats after the scores */
    float *out;     /* the output row; the sums (or paired sums) accumulate in it */
    int64_t lo, p;  /* the keys it attends, lo to p */
    int64_t next;   /* the next key to score */
    int64_t pair;   /* the next key (from lo) of the generic value sums' pairs */
    float m, total;
#if defined(AVX512_ATTENTION) || defined(AVX2_ATTENTION)
    top_vec top; /* the maximum of the full blocks' scores, lane by lane */
#endif
} attn_query;

/* The scores of a short last block's valid keys (the block's others dropped), keeping the query's
 * maximum. */
static inline __attribute__((always_inline)) void last_block_scores(attn_query *y, int64_t j,
                                                                    const float *s, int valid) {
    for (int r = 0; r < valid; r++) {
        y->scores[j - y->lo + r] = s[r];
        y->m = s[r] > y->m ? s[r] : y->m;
    }
}

/* Scores the block of keys at j (16 keys with AVX-512, 8 with AVX2; a short last block of a
 * paired cache or of AVX2 as a whole block that repeats its last key; KB for the rest: other head
 * sizes, and with AVX-512 unpaired the keys after the last 16-key block), keeping the query's
 * maximum; the next key. */
static inline __attribute__((always_inline)) int64_t score_block(const brisk_forward_args *a,
                                                                 const void *keys, attn_query *y,
                                                                 int64_t j, int paired, int ct) {
    const int d = a->head_dim;
    const int64_t p = y->p;
    (void)paired;
#if defined(AVX512_ATTENTION)
    if (paired) {
        const int valid = p + 1 - j < 16 ? (int)(p + 1 - j) : 16;
        const vf s = dot16_keys_paired(CACHE_AT(keys, j * d, ct), valid, y->q, d) * a->scale;
        if (valid == 16) {
            memcpy(y->scores + (j - y->lo), &s, sizeof s);
            y->top = vmax(y->top, s);
        } else {
            last_block_scores(y, j, (const float *)&s, valid);
        }
        return j + 16;
    }
    if (d % VW == 0 && j + 16 <= p + 1) {
        const vf s = dot16_keys(CACHE_AT(keys, j * d, ct), y->q, d, ct) * a->scale;
        memcpy(y->scores + (j - y->lo), &s, sizeof s);
        y->top = vmax(y->top, s);
        return j + 16;
    }
#endif
#if defined(AVX2_ATTENTION)
    if (d % PW == 0) {
        const int valid = p + 1 - j < 8 ? (int)(p + 1 - j) : 8;
        const void *block = CACHE_AT(keys, j * d, ct);
        const pv s = (paired ? dot8_keys_paired(block, valid, y->q, d)
                             : dot8_keys(block, valid, y->q, d, ct)) *
                     a->scale;
        if (valid == 8) {
            memcpy(y->scores + (j - y->lo), &s, sizeof s);
            y->top = pv_max(y->top, s);
        } else {
            last_block_scores(y, j, (const float *)&s, valid);
        }
        return j + 8;
    }
#endif
    const int nr = p + 1 - j < KB ? (int)(p + 1 - j) : KB;
    float out[KB] = {0};
    key_scores(CACHE_AT(keys, j * d, ct), nr, y->q, d, out, ct);
    for (int r = 0; r < nr; r++) {
        const float s = out[r] * a->scale;
        y->scores[j - y->lo + r] = s;
        if (s > y->m) y->m = s;
    }
    return j + nr;
}

/* The query's scores as softmax weights exp(s - max), their total in y->total; its sums zeroed. */
static void softmax_weights(attn_query *y, int d) {
#if defined(AVX512_ATTENTION) || defined(AVX2_ATTENTION)
    for (int r = 0; r < (int)(sizeof(top_vec) / sizeof(float)); r++)
        y->m = y->top[r] > y->m ? y->top[r] : y->m;
#endif
    const int64_t count = y->p + 1 - y->lo;
    float *scores = y->scores;
    const float m = y->m;
    int64_t j = 0;
    for (; j + EW <= count; j += EW) {
        const ev w = vexp_nonpositive(ev_load(scores + j) - m);
        memcpy(scores + j, &w, sizeof w);
    }
    if (j < count) { /* the last ones in a padded vector */
        ev x = {0};
        memcpy(&x, scores + j, sizeof(float) * (count - j));
        const ev w = vexp_nonpositive(x - m);
        memcpy(scores + j, &w, sizeof(float) * (count - j));
    }
    vf lanes = {0};
    for (j = 0; j + VW <= count; j += VW) lanes += vload(scores + j);
    float total = vsum(lanes);
    for (; j < count; j++) total += scores[j];
    y->total = total;
    memset(y->out, 0, sizeof(float) * d);
    memset(y->extra, 0, sizeof(float) * (d + VW));
}

#if defined(AVX2_ATTENTION)
/* Output columns summed VALUE_BLOCK at a time, the sums in registers over a tile's keys. */
#define VALUE_COLUMNS(d) ((d) / VALUE_BLOCK * VALUE_BLOCK)
#else
#define VALUE_COLUMNS(d) 0
#endif

/* Columns [c0, c0 + width) of the generic sums (width <= MAX_REG_DIM) over the pairs of keys from
 * key `from` (from lo; even) to `to`, then key `to` alone if `single`: the sums of the even and
 * the odd keys (two FMA chains) in acc_mem and odd_mem, the columns after the last full vector in
 * tail_mem (one chain). */
static inline __attribute__((always_inline)) void generic_values_add(
    const float *p, const void *v0, int64_t from, int64_t to, int single, int d, int c0, int width,
    float *acc_mem, float *odd_mem, float *tail_mem, int ct) {
    const int nv = width / VW;
    vf acc[MAX_REG_DIM / VW], odd[MAX_REG_DIM / VW];
    float tail[VW];
    for (int v = 0; v < nv; v++) {
        acc[v] = vload(acc_mem + v * VW);
        odd[v] = vload(odd_mem + v * VW);
    }
    for (int i = nv * VW; i < width; i++) tail[i - nv * VW] = tail_mem[i - nv * VW];
    for (int64_t j = from; j < to; j += 2) {
        const float pj = p[j], pk = p[j + 1];
        const int64_t row = j * d + c0, next = row + d;
        for (int v = 0; v < nv; v++) {
            acc[v] += pj * cload16(v0, row + v * VW, ct);
            odd[v] += pk * cload16(v0, next + v * VW, ct);
        }
        for (int i = nv * VW; i < width; i++)
            tail[i - nv * VW] += pj * cload1(v0, row + i, ct) + pk * cload1(v0, next + i, ct);
    }
    if (single) {
        const float pj = p[to];
        const int64_t row = to * d + c0;
        for (int v = 0; v < nv; v++) acc[v] += pj * cload16(v0, row + v * VW, ct);
        for (int i = nv * VW; i < width; i++) tail[i - nv * VW] += pj * cload1(v0, row + i, ct);
    }
    for (int v = 0; v < nv; v++) {
        memcpy(acc_mem + v * VW, &acc[v], sizeof(vf));
        memcpy(odd_mem + v * VW, &odd[v], sizeof(vf));
    }
    for (int i = nv * VW; i < width; i++) tail_mem[i - nv * VW] = tail[i - nv * VW];
}

#if defined(AVX512_ATTENTION)
/* generic_values_add over a bfloat16 cache read in pairs (width a multiple of 2 * VW, so no tail):
 * each output the same sums in the same order (its bits), kept as even and odd outputs: for each
 * 32 columns, the 16 even ones' sums then the 16 odd ones' (finish_query interleaves them). */
static inline __attribute__((always_inline)) void generic_values_add_paired(
    const float *p, const void *v0, int64_t from, int64_t to, int single, int d, int c0, int width,
    float *acc_mem, float *odd_mem) {
    const int nv = width / VW;
    vf acc[MAX_REG_DIM / VW], odd[MAX_REG_DIM / VW];
    for (int v = 0; v < nv; v++) {
        acc[v] = vload(acc_mem + v * VW);
        odd[v] = vload(odd_mem + v * VW);
    }
    for (int64_t j = from; j < to; j += 2) {
        const float pj = p[j], pk = p[j + 1];
        const int64_t row = j * d + c0, next = row + d;
        for (int v = 0; v < nv; v += 2) {
            vu w, x;
            memcpy(&w, (const uint16_t *)v0 + row + v * VW, sizeof w);
            memcpy(&x, (const uint16_t *)v0 + next + v * VW, sizeof x);
            acc[v] += pj * (vf)(w << 16);
            acc[v + 1] += pj * (vf)(w & HIGH_HALF);
            odd[v] += pk * (vf)(x << 16);
            odd[v + 1] += pk * (vf)(x & HIGH_HALF);
        }
    }
    if (single) {
        const float pj = p[to];
        const int64_t row = to * d + c0;
        for (int v = 0; v < nv; v += 2) {
            vu w;
            memcpy(&w, (const uint16_t *)v0 + row + v * VW, sizeof w);
            acc[v] += pj * (vf)(w << 16);
            acc[v + 1] += pj * (vf)(w & HIGH_HALF);
        }
    }
    for (int v = 0; v < nv; v++) {
        memcpy(acc_mem + v * VW, &acc[v], sizeof(vf));
        memcpy(odd_mem + v * VW, &odd[v], sizeof(vf));
    }
}
#endif

/* generic_values_add, or generic_values_add_paired where ``paired``, with a width known at compile
 * time where it is a multiple of VW (of 2 * VW paired), as head sizes are: with a width known
 * only at run time gcc kept the sums on the stack, a load and a store around every FMA (a Zen 4,
 * the 125M model at 160 positions: a unit of three queries took 3.5 us with its keys and values
 * in the caches). Same operations, same order: the same bits. */
static inline __attribute__((always_inline)) void values_add(const float *p, const void *v0,
                                                             int64_t from, int64_t to, int single,
                                                             int d, int c0, int width,
                                                             float *acc_mem, float *odd_mem,
                                                             float *tail_mem, int paired, int ct) {
#if defined(AVX512_ATTENTION)
    if (paired) {
#define PAIRED_CASE(W)                                                                         \
    case W: generic_values_add_paired(p, v0, from, to, single, d, c0, W, acc_mem, odd_mem); \
        return;
        switch (width) {
            PAIRED_CASE(2 * VW)
            PAIRED_CASE(4 * VW)
            PAIRED_CASE(6 * VW)
            PAIRED_CASE(8 * VW)
            default:
                generic_values_add_paired(p, v0, from, to, single, d, c0, width, acc_mem, odd_mem);
                return;
        }
#undef PAIRED_CASE
    }
#else
    (void)paired;
#endif
#define VALUES_CASE(W)                                                                           \
    case W:                                                                                      \
        generic_values_add(p, v0, from, to, single, d, c0, W, acc_mem, odd_mem, tail_mem, ct); \
        return;
    switch (width) {
        VALUES_CASE(VW)
        VALUES_CASE(2 * VW)
        VALUES_CASE(3 * VW)
        VALUES_CASE(4 * VW)
        VALUES_CASE(5 * VW)
        VALUES_CASE(6 * VW)
        VALUES_CASE(7 * VW)
        VALUES_CASE(8 * VW)
        default:
            generic_values_add(p, v0, from, to, single, d, c0, width, acc_mem, odd_mem, tail_mem,
                               ct);
    }
#undef VALUES_CASE
}
#if MAX_REG_DIM != 8 * VW
#error "values_add: one case per multiple of VW up to MAX_REG_DIM"
#endif

/* The query's weighted sums over the values of keys t0 to t1 (those it attends), continued from
 * the tiles before. */
static inline __attribute__((always_inline)) void values_tile(const brisk_forward_args *a,
                                                              const void *values, attn_query *y,
                                                              int64_t t0, int64_t t1, int paired,
                                                              int ct) {
    const int d = a->head_dim;
    const int64_t lo = y->lo, count = y->p + 1 - lo;
    const void *v0 = CACHE_AT(values, lo * d, ct);
    (void)paired, (void)t0;
#if defined(AVX2_ATTENTION)
    const int64_t from = t0 > lo ? t0 - lo : 0, to = t1 - lo < count ? t1 - lo : count;
    if (from < to) {
        for (int c0 = 0; c0 < VALUE_COLUMNS(d); c0 += VALUE_BLOCK) {
            const void *v = CACHE_AT(v0, from * d + c0, ct);
            if (paired)
                weighted_values64_paired(y->scores + from, v, to - from, d, y->out + c0);
            else
                weighted_values64(y->scores + from, v, to - from, d, y->out + c0, ct);
        }
    }
#endif
    if (VALUE_COLUMNS(d) == d) return;
    /* The generic sums' pairs of keys from lo: those that start before t1. */
    const int64_t limit = t1 - lo < count ? t1 - lo : count, from_pair = y->pair;
    int64_t to_pair = from_pair;
    while (to_pair + 2 <= count && to_pair < limit) to_pair += 2;
    const int single = to_pair < count && to_pair < limit; /* the last key, of an odd count */
    for (int c0 = VALUE_COLUMNS(d); c0 < d; c0 += MAX_REG_DIM) {
        const int width = d - c0 < MAX_REG_DIM ? d - c0 : MAX_REG_DIM;
        values_add(y->scores, v0, from_pair, to_pair, single, d, c0, width, y->out + c0,
                   y->extra + c0, y->extra + d, paired, ct);
    }
    y->pair = to_pair + single;
}

/* The query's output: its sums over the total of its weights. */
static void finish_query(const attn_query *y, int d, int paired) {
    const float inv = 1.0f / y->total;
    float *out = y->out;
    int c0 = 0;
#if defined(AVX2_ATTENTION)
    for (; c0 < VALUE_COLUMNS(d); c0 += 16) {
        const pv e = pload(out + c0) * inv, o = pload(out + c0 + PW) * inv;
        if (paired) { /* even and odd outputs, interleaved */
            const pv lo = SHUF(e, o, 0, 8, 1, 9, 2, 10, 3, 11), hi = SHUF(e, o, 4, 12, 5, 13, 6, 14, 7, 15);
            memcpy(out + c0, &lo, sizeof lo);
            memcpy(out + c0 + PW, &hi, sizeof hi);
        } else {
            memcpy(out + c0, &e, sizeof e);
            memcpy(out + c0 + PW, &o, sizeof o);
        }
    }
#elif defined(AVX512_ATTENTION)
    if (paired) { /* even and odd outputs of each 32, interleaved */
        for (; c0 < d; c0 += 2 * VW) {
            const vf e = (vload(out + c0) + vload(y->extra + c0)) * inv;
            const vf o = (vload(out + c0 + VW) + vload(y->extra + c0 + VW)) * inv;
            const vf lo = SHUF(e, o, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
            const vf hi = SHUF(e, o, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
            memcpy(out + c0, &lo, sizeof lo);
            memcpy(out + c0 + VW, &hi, sizeof hi);
        }
        return;
    }
#else
    (void)paired;
#endif
    for (; c0 < d; c0 += MAX_REG_DIM) {
        const int width = d - c0 < MAX_REG_DIM ? d - c0 : MAX_REG_DIM, nv = width / VW;
        for (int v = 0; v < nv; v++) {
            const vf scaled = (vload(out + c0 + v * VW) + vload(y->extra + c0 + v * VW)) * inv;
            memcpy(out + c0 + v * VW, &scaled, sizeof scaled);
        }
        for (int i = nv * VW; i < width; i++) out[c0 + i] = y->extra[d + i - nv * VW] * inv;
    }
}

/* Attention of a unit's queries over their cache slot's keys and values (space: the thread's
 * UNIT_QUERIES * QUERY_SPACE floats). */
static inline __attribute__((always_inline)) void attend_unit(const brisk_forward_args *a,
                                                              int layer, const attn_unit *u,
                                                              float *space, int ct) {
    const int d = a->head_dim, hkv = a->n_kv_heads, nh = u->h1 - u->h0;
    const int nq = (u->t1 - u->t0) * nh;
    const int64_t qkv_ld = (int64_t)(a->n_heads + 2 * hkv) * d, stride = QUERY_SPACE(a);
    const int g = u->h0 / (a->n_heads / hkv);
    const int64_t head_off = ((a->slots[u->t0] * hkv) + g) * a->max_seq_len * d;
    const void *keys = CACHE_AT(a->k_cache[layer], head_off, ct),
               *values = CACHE_AT(a->v_cache[layer], head_off, ct);
#if defined(AVX2_ATTENTION)
    const int pair_lanes = PW;
#elif defined(AVX512_ATTENTION)
    const int pair_lanes = VW;
#else
    const int pair_lanes = 0; /* no pairs */
#endif
    const int paired = pair_lanes && ct == WT_BF16 && d % (2 * pair_lanes) == 0 && d <= PAIRED_DIM;
    attn_query x[UNIT_QUERIES];
    int64_t first = INT64_MAX, last = -1;
    for (int i = 0; i < nq; i++) {
        const int n = u->t0 + i / nh, h = u->h0 + i % nh;
        attn_query *y = &x[i];
        y->scores = space + i * stride;
        y->extra = y->scores + a->max_seq_len;
        y->out = a->attn + (int64_t)n * a->n_heads * d + (int64_t)h * d;
        y->q = a->qkv + n * qkv_ld + (int64_t)h * d;
        if (paired) {
            pair_query(y->q, d, y->extra, pair_lanes);
            y->q = y->extra;
        }
        y->p = a->positions[n];
        y->lo = 0;
        if (a->window[layer] > 0 && y->p - a->window[layer] + 1 > 0)
            y->lo = y->p - a->window[layer] + 1;
        y->next = y->lo;
        y->pair = 0;
        y->m = -INFINITY;
#if defined(AVX512_ATTENTION) || defined(AVX2_ATTENTION)
        y->top = TOP_INIT;
#endif
        first = y->lo < first ? y->lo : first;
        last = y->p > last ? y->p : last;
    }
    int64_t tile = TILE_BYTES / ((int64_t)d * WT_SIZE(ct)) / 16 * 16;
    if (tile < 16) tile = 16;
    const int64_t bytes = (last + 1 - first) * d * WT_SIZE(ct);
    if (bytes <= ASK_KEYS_BYTES) {
        const char *k0 = CACHE_AT(keys, first * d, ct), *v0 = CACHE_AT(values, first * d, ct);
        for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch(k0 + at, 0, 3);
        for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch(v0 + at, 0, 2);
    }
    for (int64_t t0 = first; t0 <= last; t0 += tile) {
        for (int i = 0; i < nq; i++) {
            attn_query *y = &x[i];
            while (y->next <= y->p && y->next < t0 + tile)
                y->next = score_block(a, keys, y, y->next, paired, ct);
        }
    }
    for (int i = 0; i < nq; i++) softmax_weights(&x[i], d);
    for (int64_t t0 = first; t0 <= last; t0 += tile) {
        for (int i = 0; i < nq; i++) values_tile(a, values, &x[i], t0, t0 + tile, paired, ct);
    }
    for (int i = 0; i < nq; i++) finish_query(&x[i], d, paired);
}

/* attend_unit compiled for the cache's type. */
static void attend(const brisk_forward_args *a, int layer, const attn_unit *u, float *space) {
    switch (a->cache_type) {
        case WT_BF16: attend_unit(a, layer, u, space, WT_BF16); break;
        case WT_F16: attend_unit(a, layer, u, space, WT_F16); break;
        default: attend_unit(a, layer, u, space, WT_F32); break;
    }
}

/* A call's attention units into units (room for n_tokens * n_heads); their number. Each row's
 * tokens (a run of tokens at one slot) and each group's heads are split into as few units of at
 * most UNIT_QUERIES queries as they fit, of near-equal sizes, in group-major order (so that a
 * thread's share of a row reads few groups). Where that leaves fewer units than threads, each
 * query is a unit of its own (as many as the threads can share). */
static int attention_units(const brisk_forward_args *a, attn_unit *units) {
    const int n = a->n_tokens, hq = a->n_heads, group = hq / a->n_kv_heads;
    const int head_parts = (group + UNIT_QUERIES - 1) / UNIT_QUERIES;
    const int heads_max = (group + head_parts - 1) / head_parts,
              tokens_max = UNIT_QUERIES / heads_max;
    int count = 0;
    for (int t0 = 0, t1; t0 < n; t0 = t1) {
        for (t1 = t0 + 1; t1 < n && a->slots[t1] == a->slots[t0];) t1++;
        const int run = t1 - t0, token_parts = (run + tokens_max - 1) / tokens_max;
        for (int g = 0; g < a->n_kv_heads; g++)
            for (int hp = 0; hp < head_parts; hp++)
                for (int tp = 0; tp < token_parts; tp++)
                    units[count++] = (attn_unit){t0 + run * tp / token_parts,
                                                 t0 + run * (tp + 1) / token_parts,
                                                 g * group + group * hp / head_parts,
                                                 g * group + group * (hp + 1) / head_parts};
    }
    if (count >= a->n_threads) return count;
    count = 0;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < hq; h++) units[count++] = (attn_unit){t, t + 1, h, h + 1};
    return count;
}

/* The call's attention units (attention_units), allocated (NULL if out of memory; free it). */
static attn_unit *new_attention_units(const brisk_forward_args *a, int *count) {
    attn_unit *units = malloc(sizeof(attn_unit) * a->n_tokens * a->n_heads);
    if (units) *count = attention_units(a, units);
    return units;
}

/* (v, at) into the best so far (*best, *best_at; *best_at < 0: none yet): torch's max(dim) on
 * CPU, which greedy sampling takes (brisklm.sampling.sampler.greedy_tokens): the largest value,
 * the first of equal ones (-0.0 equals 0.0), a NaN larger than any number (team_argmax and
 * first_largest then give -1: greedy_tokens takes no token there). Candidates may come in any
 * order. */
static inline void take_larger(float v, int64_t at, float *best, int64_t *best_at) {
    const float b = *best;
    int better;
    if (*best_at < 0)
        better = 1;
    else if (b != b) /* NaN: only an earlier NaN replaces it */
        better = v != v && at < *best_at;
    else
        better = v != v || v > b || (v == b && at < *best_at);
    if (better) {
        *best = v;
        *best_at = at;
    }
}

/* The best (take_larger) of row[c0, c1) into *best, *best_at. Each lane keeps the first largest
 * of its columns in order, so the lanes' bests hold the row's. */
static void scan_larger(const float *row, int64_t c0, int64_t c1, float *best, int64_t *best_at) {
    int64_t c = c0;
    if (c1 - c0 >= 2 * EW) {
        evi lane;
        for (int i = 0; i < EW; i++) lane[i] = i;
        ev b = ev_load(row + c0);
        evi b_at = lane;
        for (c = c0 + EW; c + EW <= c1; c += EW) {
            const ev v = ev_load(row + c);
            const evi take = (v > b) | ((v != v) & (b == b));
            b = ev_select(take, v, b);
            b_at = (take & (lane + (int32_t)(c - c0))) | (~take & b_at);
        }
        for (int i = 0; i < EW; i++) take_larger(b[i], c0 + b_at[i], best, best_at);
    }
    for (; c < c1; c++) take_larger(row[c], c, best, best_at);
}

/* One thread's best (take_larger) of one row's columns; at < 0: it had none. */
typedef struct {
    float value;
    int64_t at;
} argmax_share;

/* out[r] = the greedy token of row r of x (rows x ld) over its first cols columns (take_larger),
 * for every row; -1 where the largest is a NaN (as greedy_tokens: nothing to take). Called by
 * every thread of the team (found: team * rows shares): each scans the columns whose panels its
 * own share of matmul_team held (it computed most of them, so they are in its caches), then
 * thread 0 merges the shares. Ends with a barrier. */
static void team_argmax(const float *x, int64_t ld, int rows, int64_t cols, int64_t *out,
                        argmax_share *found, team_sync *sync) {
    const int team = TEAM_SIZE(), tid = THREAD_NUM();
    const int64_t panels = (cols + NB - 1) / NB;
    int64_t c0 = panels * tid / team * NB, c1 = panels * (tid + 1) / team * NB;
    if (c1 > cols) c1 = cols;
    for (int r = 0; r < rows; r++) {
        argmax_share *mine = &found[(int64_t)r * team + tid];
        mine->value = 0.0f;
        mine->at = -1;
        if (c0 < c1) scan_larger(x + r * ld, c0, c1, &mine->value, &mine->at);
    }
    team_barrier(sync);
    if (tid == 0) {
        for (int r = 0; r < rows; r++) {
            float best = 0.0f;
            int64_t best_at = -1;
            for (int t = 0; t < team; t++) {
                const argmax_share *share = &found[(int64_t)r * team + t];
                if (share->at >= 0) take_larger(share->value, share->at, &best, &best_at);
            }
            out[r] = best != best ? -1 : best_at;
        }
    }
    team_barrier(sync);
}

static double row_distribution(const float *x, int64_t n, float temperature, int64_t top_k,
                               float top_p, float min_p, float *z, float *w, float *buf, float *e);
static int64_t draw_row(const float *w, int64_t n, double total, double u);

/* A product rounded to float32 on its own: a barrier the compiler cannot fuse into the next
 * addition (the kernels build with -ffp-contract=fast), as torch computes f * c, then x - it. */
#if defined(__x86_64__) || defined(__i386__)
#define ROUNDED(v) __asm__("" : "+x"(v))
#elif defined(__aarch64__)
#define ROUNDED(v) __asm__("" : "+w"(v))
#else
#define ROUNDED(v)                 \
    do {                           \
        volatile float kept_ = (v); \
        (v) = kept_;               \
    } while (0)
#endif

/* brisklm.sampling.sampler's _adjust_logits on logits row r (x, vocab wide), bit for bit: the
 * bias added; on the tokens seen, x / repetition where x > 0, else x * repetition, clamped below
 * the largest float; then x - frequency * count, and - presence where the count is positive.
 * Tokens of count 0 are left alone, where torch subtracts 0 * frequency and 0 * presence (the
 * same value, but for the sign of a zero). */
static int check_adjustments(const brisk_forward_args *a) {
    if (a->n_bias < 0 || (a->n_bias && (!a->bias_rows || !a->bias_ids || !a->bias_values)) ||
        (a->repetition && !a->seen) || (a->frequency && (!a->presence || !a->counts)))
        return 1;
    for (int64_t i = 0; i < a->n_bias; i++)
        if (a->bias_rows[i] < 0 || a->bias_rows[i] >= a->n_logits || a->bias_ids[i] < 0 ||
            a->bias_ids[i] >= a->vocab)
            return 1;
    return 0;
}

static void adjust_logits_row(const brisk_forward_args *a, int r, float *x) {
    const int64_t v = a->vocab;
    for (int64_t i = 0; i < a->n_bias; i++)
        if (a->bias_rows[i] == r) x[a->bias_ids[i]] += a->bias_values[i];
    if (a->repetition) {
        const float p = a->repetition[r];
        const uint8_t *seen = a->seen + (int64_t)r * v;
        for (int64_t t = 0; t < v; t++) {
            if (!seen[t]) continue;
            const float y = x[t] > 0.0f ? x[t] / p : x[t] * p;
            x[t] = y > FLT_MAX ? FLT_MAX : y;
        }
    }
    if (a->frequency) {
        const float f = a->frequency[r], q = a->presence[r];
        const float *counts = a->counts + (int64_t)r * v;
        for (int64_t t = 0; t < v; t++) {
            if (counts[t] == 0.0f) continue;
            float product = f * counts[t];
            ROUNDED(product);
            x[t] = (x[t] - product) - q;
        }
    }
}

/* The bytes of the argument structs, which the Python side mirrors (kernels/native.py checks its
 * own against them: a struct the C side reads past the Python one's end would be garbage). */
int64_t brisk_forward_args_bytes(void) { return (int64_t)sizeof(brisk_forward_args); }
int64_t brisk_q4_weight_bytes(void) { return (int64_t)sizeof(q4_weight); }

/* adjust_logits_row on each of a->n_logits rows of logits (a->vocab wide), on their own: 1 where
 * the adjustments do not check. */
int brisk_adjust_logits(const brisk_forward_args *a, float *logits) {
    if (a->n_logits < 0 || a->vocab < 1 || check_adjustments(a)) return 1;
    for (int r = 0; r < a->n_logits; r++) adjust_logits_row(a, r, logits + (int64_t)r * a->vocab);
    return 0;
}

/* One forward pass of n_tokens tokens (embedding rows looked up here; each token at its own slot
 * and position, caches written for all of them before any attends), then the final norm and LM
 * head for the n_logits tokens listed. Token ids are checked by the caller. With n_steps > 1,
 * n_steps greedy passes of one token a row (see brisk_forward_args), each computed as a call of
 * its own would compute it: the team stays up between them, and the caller's Python runs once for
 * them all. */
int brisk_forward_f32(const brisk_forward_args *given) {
    const int steps = given->n_steps > 1 ? given->n_steps : 1;
    brisk_forward_args stepped = *given; /* its token ids and positions move on at each step */
    int64_t step_ids[MAX_TOKENS], step_positions[MAX_TOKENS];
    const int sampling = given->step_uniforms != NULL;
    const int adjusting = given->n_bias != 0 || given->repetition || given->frequency;
    /* the steps' tokens go to step_tokens */
    const int stepping = steps > 1 || sampling || adjusting || given->step_logits;
    if (adjusting && check_adjustments(given)) return 1;
    if (given->steps_done) *given->steps_done = 0;
    if (stepping) {
        const int rows = given->n_tokens;
        if (rows < 1 || rows > MAX_TOKENS || given->n_logits != rows || given->argmax_cols <= 0 ||
            !given->step_tokens || given->rope_rows != given->positions ||
            (int64_t)steps * rows > MAX_TOKENS || !given->steps_done)
            return 1;
        if (sampling && (!given->sampled_rows || !given->temperature || !given->top_k ||
                         !given->top_p || !given->min_p))
            return 1;
        for (int r = 0; r < rows; r++) {
            if (given->logit_tokens[r] != r || given->positions[r] < 0 ||
                given->positions[r] + steps > given->max_seq_len)
                return 1;
            step_ids[r] = given->token_ids[r];
            step_positions[r] = given->positions[r];
        }
        stepped.token_ids = step_ids;
        stepped.positions = stepped.rope_rows = step_positions;
    }
    const brisk_forward_args *a = &stepped;
    const int n = a->n_tokens, e = a->hidden, hq = a->n_heads, hkv = a->n_kv_heads,
              d = a->head_dim, inter = a->inter;
    if (a->weight_type != WT_F32 && a->weight_type != WT_BF16 && a->weight_type != WT_F16)
        return 1;
    if (a->cache_type != WT_F32 && a->cache_type != WT_BF16 && a->cache_type != WT_F16) return 1;
    if (n < 1 || n > MAX_TOKENS || a->n_logits > MAX_TOKENS || hq % hkv != 0 || d % 2 != 0) return 1;
    if (a->head_type < WT_F32 || a->head_type > WT_INT4 || !a->layer_types) return 1;
    const int qkv_rows = (hq + 2 * hkv) * d;
    const int64_t qkv_ld = qkv_rows;
    /* Bytes of the products' weights (an int4 weight's codes only) */
    const int64_t product_weights[4] = {(int64_t)e * qkv_rows, (int64_t)hq * d * e,
                                        2 * (int64_t)e * inter, (int64_t)e * inter};
    int64_t weight_bytes = (int64_t)a->vocab * e * ROW_BYTES(a->head_type) / NB;
    for (int l = 0; l < a->n_layers; l++) {
        for (int j = 0; j < 4; j++) {
            const int wt = a->layer_types[4 * l + j];
            if (wt < WT_F32 || wt > WT_INT4) return 1;
            weight_bytes += product_weights[j] * ROW_BYTES(wt) / NB;
        }
    }
    const int stream = weight_bytes >= STREAM_FROM;
    const int silu_chunks = (inter + SILU_CHUNK - 1) / SILU_CHUNK;
    int n_units = 0;
    attn_unit *units = new_attention_units(a, &n_units);
    if (!units) return 1;
    const int team_size = a->n_threads < MAX_TEAM ? a->n_threads : MAX_TEAM;
    argmax_share *found = NULL; /* team_argmax's scratch */
    if (a->argmax_cols != 0 && a->n_logits > 0) {
        if (!a->argmax || a->argmax_cols < 0 || a->argmax_cols > a->vocab) {
            free(units);
            return 1;
        }
        found = malloc(sizeof(argmax_share) * team_size * a->n_logits);
        if (!found) {
            free(units);
            return 1;
        }
    }
    float *draw_space = NULL; /* each thread's room for a sampled row (row_distribution's) */
    if (sampling) {
        draw_space = malloc(sizeof(float) * 4 * (size_t)a->vocab * team_size);
        if (!draw_space) {
            free(units);
            free(found);
            return 1;
        }
    }
    team_slot slots[MAX_TEAM] = {{0}};
    team_sync sync = {0}; /* the phases' barrier (the loops' own are dropped: nowait) */
    int nothing_drawn = 0; /* a sampled row had nothing to draw: the call ends (thread 0 sets) */
#pragma omp parallel num_threads(team_size)
    {
        const int tid = THREAD_NUM();
        float *space = thread_space(a, tid);
        for (int step = 0; step < steps; step++) {
#pragma omp for schedule(static) nowait
            for (int t = 0; t < n; t++) {
                embedding_row(a->embed, a->weight_type, a->token_ids[t], e,
                              a->hidden_states + (int64_t)t * e);
            }
            team_barrier(&sync);
            for (int l = 0; l < a->n_layers; l++) {
#pragma omp for schedule(static) nowait
                for (int t = 0; t < n; t++)
                    rms_norm(a->hidden_states + (int64_t)t * e, a->in_norm[l], e, a->eps, a->xn + (int64_t)t * e);
                team_barrier(&sync);
                matmul_team(a->xn, e, n, e, a->qkv_w[l], a->layer_types[4 * l + 0], a->qkv_b[l], qkv_rows, a->qkv, qkv_ld, 0, slots, &sync, stream);
#pragma omp for schedule(static) nowait
                for (int item = 0; item < n * (hq + 2 * hkv); item++) {
                    int t = item / (hq + 2 * hkv), h = item % (hq + 2 * hkv);
                    float *x = a->qkv + t * qkv_ld + (int64_t)h * d;
                    const int64_t row = a->rope_rows[t] * d;
                    if (h < hq + hkv) {
                        if (a->q_norm) rms_norm(x, h < hq ? a->q_norm[l] : a->k_norm[l], d, a->eps, x);
                        rope(x, a->cos + row, a->sin + row, d);
                    }
                    if (h >= hq) {
                        int g = h < hq + hkv ? h - hq : h - hq - hkv;
                        void *cache = h < hq + hkv ? a->k_cache[l] : a->v_cache[l];
                        cstore_row(cache, ((a->slots[t] * hkv + g) * a->max_seq_len + a->positions[t]) * d,
                                   x, d, a->cache_type);
                    }
                }
                team_barrier(&sync);
#pragma omp for schedule(static) nowait
                for (int u = 0; u < n_units; u++) attend(a, l, &units[u], space);
                team_barrier(&sync);
                matmul_team(a->attn, (int64_t)hq * d, n, hq * d, a->o_w[l], a->layer_types[4 * l + 1], a->o_b[l], e, a->hidden_states, e,
                            1, slots, &sync, stream);
#pragma omp for schedule(static) nowait
                for (int t = 0; t < n; t++)
                    rms_norm(a->hidden_states + (int64_t)t * e, a->post_norm[l], e, a->eps, a->xn + (int64_t)t * e);
                team_barrier(&sync);
                /* gate and up as one product over their 2 * inter contiguous rows: computing a
                 * gate row and its up row together reads two streams at once, measurably slower
                 * (53-55 against 58-62 GB/s for the products of a 125M model). */
                matmul_team(a->xn, e, n, e, a->gu_w[l], a->layer_types[4 * l + 2], a->gu_b[l], 2 * inter, a->gate_up, 2 * inter, 0, slots, &sync, stream);
                /* In chunks of SILU_CHUNK outputs, so that a single token's SiLU is split across
                 * the threads too. */
#pragma omp for schedule(static) nowait
                for (int item = 0; item < n * silu_chunks; item++) {
                    const int t = item / silu_chunks, o = item % silu_chunks * SILU_CHUNK;
                    const float *gate = a->gate_up + (int64_t)t * 2 * inter;
                    silu_mul(gate + o, gate + inter + o, a->act + (int64_t)t * inter + o,
                             inter - o < SILU_CHUNK ? inter - o : SILU_CHUNK);
                }
                team_barrier(&sync);
                matmul_team(a->act, inter, n, inter, a->down_w[l], a->layer_types[4 * l + 3], a->down_b[l], e, a->hidden_states, e, 1, slots, &sync, stream);
            }
#pragma omp for schedule(static) nowait
            for (int r = 0; r < a->n_logits; r++)
                rms_norm(a->hidden_states + a->logit_tokens[r] * e, a->final_norm, e, a->eps,
                         a->normed + (int64_t)r * e);
            team_barrier(&sync);
            if (a->head_w && a->n_logits > 0)
                matmul_team(a->normed, e, a->n_logits, e, a->head_w, a->head_type, 0, a->vocab, a->logits, a->vocab, 0, slots, &sync, stream);
            /* The raw logits, whole: the head's product ended with a barrier. */
            if (a->step_logits) {
#pragma omp for schedule(static) nowait
                for (int r = 0; r < a->n_logits; r++)
                    memcpy(a->step_logits + ((int64_t)step * a->n_logits + r) * a->vocab,
                           a->logits + (int64_t)r * a->vocab, sizeof(float) * a->vocab);
                team_barrier(&sync);
            }
            if (adjusting) { /* the logits are whole */
#pragma omp for schedule(static) nowait
                for (int r = 0; r < a->n_logits; r++)
                    adjust_logits_row(a, r, a->logits + (int64_t)r * a->vocab);
                team_barrier(&sync);
            }
            if (found) team_argmax(a->logits, a->vocab, a->n_logits, a->argmax_cols, a->argmax, found, &sync);
            if (sampling) { /* team_argmax ended with a barrier: the logits are whole */
                float *z = draw_space + (int64_t)4 * a->vocab * tid, *w = z + a->vocab,
                      *buf = w + a->vocab, *ex = buf + a->vocab;
#pragma omp for schedule(static) nowait
                for (int r = 0; r < n; r++) {
                    if (!a->sampled_rows[r]) continue;
                    float *x = a->logits + (int64_t)r * a->vocab; /* as the engine masks them */
                    for (int64_t i = a->argmax_cols; i < a->vocab; i++) x[i] = -INFINITY;
                    const double total = row_distribution(x, a->vocab, a->temperature[r],
                                                          a->top_k[r], a->top_p[r], a->min_p[r],
                                                          z, w, buf, ex);
                    a->argmax[r] = total > 0.0
                                       ? draw_row(w, a->vocab, total,
                                                  a->step_uniforms[(int64_t)step * n + r])
                                       : -1;
                }
                team_barrier(&sync);
            }
            if (stepping) { /* the tokens are there */
                if (tid == 0) { /* (the attention units depend on the rows' slots, not positions) */
                    int none = 0;
                    for (int r = 0; r < n; r++)
                        if (a->argmax[r] < 0) none = 1;
                    __atomic_store_n(&nothing_drawn, none, __ATOMIC_RELAXED);
                    if (!none) {
                        for (int r = 0; r < n; r++) {
                            const int64_t token = a->argmax[r];
                            a->step_tokens[(int64_t)step * n + r] = step_ids[r] = token;
                            step_positions[r]++;
                            if (a->seen) a->seen[(int64_t)r * a->vocab + token] = 1;
                            if (a->counts) a->counts[(int64_t)r * a->vocab + token] += 1.0f;
                        }
                        *a->steps_done = step + 1;
                    }
                }
                team_barrier(&sync); /* (orders thread 0's store before the loads) */
                if (__atomic_load_n(&nothing_drawn, __ATOMIC_RELAXED)) break;
            }
        }
    }
    free(units);
    free(found);
    free(draw_space);
    return 0;
}

/* y (n x rows) = x (n x k) @ W.T (+ b), W packed in panels of float32 (brisk_linear_f32),
 * bfloat16 (brisk_linear_bf16), float16 (brisk_linear_f16) or int4 (brisk_linear_int4): the
 * products above, on their own (same bits per row). */
static int linear_team(const float *x, int n, int k, const void *w, int wt, const float *b,
                       int rows, float *y, int n_threads) {
    if (n < 1) return 1;
    team_slot slots[MAX_TEAM] = {{0}};
    team_sync sync = {0};
    const int stream = (int64_t)rows * k * ROW_BYTES(wt) / NB >= STREAM_FROM;
#pragma omp parallel num_threads(n_threads < MAX_TEAM ? n_threads : MAX_TEAM)
    matmul_team(x, k, n, k, w, wt, b, rows, y, rows, 0, slots, &sync, stream);
    return 0;
}

int brisk_linear_f32(const float *x, int n, int k, const float *w, const float *b, int rows,
                     float *y, int n_threads) {
    return linear_team(x, n, k, w, WT_F32, b, rows, y, n_threads);
}

int brisk_linear_bf16(const float *x, int n, int k, const uint16_t *w, const float *b, int rows,
                      float *y, int n_threads) {
    return linear_team(x, n, k, w, WT_BF16, b, rows, y, n_threads);
}

int brisk_linear_f16(const float *x, int n, int k, const uint16_t *w, const float *b, int rows,
                     float *y, int n_threads) {
    return linear_team(x, n, k, w, WT_F16, b, rows, y, n_threads);
}

int brisk_linear_int4(const float *x, int n, int k, const q4_weight *w, const float *b, int rows,
                      float *y, int n_threads) {
    return linear_team(x, n, k, w, WT_INT4, b, rows, y, n_threads);
}

/* Tests only: team_argmax of x (rows x ld) over its first cols columns, by a team of n_threads
 * (the forward pass's greedy tokens; 1 if it cannot run). */
int brisk_test_argmax(const float *x, int64_t ld, int rows, int64_t cols, int64_t *out,
                      int n_threads) {
    const int team_size = n_threads < MAX_TEAM ? n_threads : MAX_TEAM;
    if (rows < 1 || cols < 1 || cols > ld || team_size < 1) return 1;
    argmax_share *found = malloc(sizeof(argmax_share) * team_size * rows);
    if (!found) return 1;
    team_sync sync = {0};
#pragma omp parallel num_threads(team_size)
    team_argmax(x, ld, rows, cols, out, found, &sync);
    free(found);
    return 0;
}

/* A grammar's token bitmask on float32 logits, in place: for each listed row r (rows[i], or i when
 * rows is NULL; i < n_rows), token t keeps its logit where bit t % 32 of word t / 32 of bitmask
 * row r (words int32 a row) is set, and becomes -inf otherwise, as do tokens at or past 32 * words
 * (a vocabulary padded past the tokenizer's). A NaN logit masked out becomes -inf too. The torch
 * ops that do this cost ~60 us a row of 4,096 right after a forward pass; this ~2. */
void brisk_apply_bitmask_f32(float *logits, int64_t ld, int64_t vocab, const int32_t *bitmask,
                             int64_t words, const int64_t *rows, int64_t n_rows) {
    const int64_t covered = 32 * words < vocab ? 32 * words : vocab;
    for (int64_t i = 0; i < n_rows; i++) {
        const int64_t r = rows ? rows[i] : i;
        float *row = logits + r * ld;
        const uint32_t *mask = (const uint32_t *)bitmask + r * words;
        for (int64_t w = 0; w * 32 < covered; w++) {
            uint32_t off = ~mask[w];  /* the masked-out tokens of this word */
            if (w * 32 + 32 > covered) {
                off &= (uint32_t)((1ull << (covered - w * 32)) - 1);
            } else if (off == UINT32_MAX) {  /* (most words, where few tokens are allowed) */
                for (int j = 0; j < 32; j++) row[w * 32 + j] = -INFINITY;
                continue;
            }
            while (off) {
                row[w * 32 + __builtin_ctz(off)] = -INFINITY;
                off &= off - 1;
            }
        }
        for (int64_t t = covered; t < vocab; t++) row[t] = -INFINITY;
    }
}

/* Tests only: n floats rounded into cache elements of type ct (as the forward pass writes keys and
 * values). */
void brisk_test_cache_store(const float *x, int n, void *out, int ct) {
    cstore_row(out, 0, x, n, ct);
}

/* Floats of attention scratch (a->scores) the forward pass needs per thread (native.py sizes the
 * buffer by this). */
int64_t brisk_attention_floats(int64_t max_seq_len, int head_dim) {
    const brisk_forward_args shape = {.max_seq_len = max_seq_len, .head_dim = head_dim};
    return (int64_t)UNIT_QUERIES * QUERY_SPACE(&shape);
}

/* Tests only: the forward pass's attention phase on its own, for layer 0: the queries in a->qkv
 * (rows of (n_heads + 2 * n_kv_heads) * head_dim) over the caches, into a->attn, in the units and
 * with the scratch space (a->scores) the forward pass uses. */
int brisk_test_attention(const brisk_forward_args *a) {
    if (a->n_tokens < 1 || a->n_tokens > MAX_TOKENS || a->n_heads % a->n_kv_heads != 0) return 1;
    if (a->cache_type != WT_F32 && a->cache_type != WT_BF16 && a->cache_type != WT_F16) return 1;
    int n_units = 0;
    attn_unit *units = new_attention_units(a, &n_units);
    if (!units) return 1;
#pragma omp parallel num_threads(a->n_threads < MAX_TEAM ? a->n_threads : MAX_TEAM)
    {
        float *space = thread_space(a, THREAD_NUM());
#pragma omp for schedule(static)
        for (int u = 0; u < n_units; u++) attend(a, 0, &units[u], space);
    }
    free(units);
    return 0;
}

/* Sampling a row of logits in one pass (brisk_sample_rows): brisklm.sampling.sampler's
 * temperature, top-k, top-p and min-p on a row of adjusted logits (bias, penalties and masks
 * already applied), and the inverse-CDF draw of brisklm.sampling.categorical, for the rows of one
 * step. The torch ops took ~0.2 ms a step at the bundled model's 4,096 tokens with a temperature
 * alone, ~0.35 ms with top-p: a third of a sampled token's time. Each filter is one threshold per
 * row, ties with the last kept token kept, as there. The probabilities agree with
 * processed_probs' to float32 rounding (another exp, other orders of sums), so a draw differs only
 * where its uniform falls within that rounding of a step of the cumulative sums. Where a
 * threshold meets rounding, the kept tokens can differ at the edge of a nearly flat row: the
 * nucleus is found with float64 sums where torch's cumsum is float32 (a flat row at top-p 0.99
 * kept one token of 1e-5 more of 24,500, 1,000 tokens at temperature 1e30 991 against 990; at
 * top-p 0.999999 hundreds of ~1e-8 in all, where these sums matched an exact computation), and
 * min-p compares the weights, whose largest is exactly 1,
 * where torch compares rounded probabilities. Tokens below e^-87 of the largest get no mass
 * (torch's exp gives them up to 1e-38). */

#define DRAW_BLOCK 64 /* tokens whose weights the draw sums at once (see block_mass) */

/* The row's largest logit, or NaN where one is NaN or +inf (nothing to draw). */
static float row_max_checked(const float *x, int64_t n) {
    ev m = ev_splat(-INFINITY);
    evi bad = {0};
    int64_t i = 0;
    for (; i + EW <= n; i += EW) {
        const ev v = ev_load(x + i);
        bad |= (evi)(v != v) | (evi)(v == ev_splat(INFINITY));
        m = ev_select((evi)(v > m), v, m);
    }
    float best = -INFINITY;
    int any = 0;
    for (int l = 0; l < EW; l++) {
        any |= bad[l] != 0;
        best = m[l] > best ? m[l] : best;
    }
    for (; i < n; i++) {
        any |= x[i] != x[i] || x[i] == INFINITY;
        best = x[i] > best ? x[i] : best;
    }
    return any ? NAN : best;
}

/* The sum of w[0, len) (len <= DRAW_BLOCK): float32 lanes, then the lanes in float64, in order.
 * The total and the draw both sum a row's weights block by block this way, so that the draw's
 * running sum ends on the total exactly; a block's float32 lanes hold at most DRAW_BLOCK / EW
 * weights each. */
static double block_mass(const float *w, int len) {
    ev lanes = ev_splat(0.0f);
    int j = 0;
    for (; j + EW <= len; j += EW) lanes += ev_load(w + j);
    double mass = 0.0;
    for (int l = 0; l < EW; l++) mass += lanes[l];
    for (; j < len; j++) mass += w[j];
    return mass;
}

static double row_mass(const float *w, int64_t n) {
    double total = 0.0;
    for (int64_t b = 0; b < n; b += DRAW_BLOCK)
        total += block_mass(w + b, n - b < DRAW_BLOCK ? (int)(n - b) : DRAW_BLOCK);
    return total;
}

/* The quickselects' pivots are drawn by a xorshift seeded alike at every call (a row's result,
 * and the order of its sums, then depend on the row alone): with the middle element as the pivot,
 * a row shaped as a V (its smallest values in the middle, each twice) took quadratic time, 4.8 s
 * for 128k logits under top-p (a review, session 64). A pivot does not change what is selected. */
#define PIVOT_SEED 0x9E3779B97F4A7C15ull
static inline int64_t pivot_at(uint64_t *state, int64_t lo, int64_t count) {
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return lo + (int64_t)(x % (uint64_t)count);
}

/* Reorders v[0, n) so that its k largest values (1 <= k <= n) come first, in no order. */
static void select_largest(float *v, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    uint64_t state = PIVOT_SEED;
    while (lo < hi) {
        const float pivot = v[pivot_at(&state, lo, hi - lo + 1)];
        int64_t i = lo, j = hi;
        while (i <= j) { /* Hoare's partition, larger values first */
            while (v[i] > pivot) i++;
            while (v[j] < pivot) j--;
            if (i <= j) {
                const float t = v[i];
                v[i++] = v[j];
                v[j--] = t;
            }
        }
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            return;
    }
}

/* The k-th largest of z[0, n) (1 <= k < n). A quickselect over the row mispredicts a branch at
 * about every other value (a top-k 50 step of 8 rows of 128k logits took 5.3 ms): over long rows
 * it runs over the values at or above an estimate instead, the value of a strided sample that
 * about 2k of the row's values should reach, and over the whole row only where fewer than k do.
 * buf: room for n floats. */
#define SAMPLE_VALUES 1024
static float kth_largest(const float *z, int64_t n, int64_t k, float *buf) {
    int64_t c = 0;
    if (n >= 4 * SAMPLE_VALUES) {
        const int64_t stride = n / SAMPLE_VALUES;
        int64_t s = 0;
        for (int64_t i = 0; i < n && s < SAMPLE_VALUES; i += stride) buf[s++] = z[i];
        const int64_t rank = (2 * k * s + n - 1) / n; /* >= 1: k >= 1 */
        if (rank <= s) {
            select_largest(buf, s, rank);
            float estimate = buf[0];
            for (int64_t j = 1; j < rank; j++) estimate = buf[j] < estimate ? buf[j] : estimate;
            for (int64_t i = 0; i < n; i++)
                if (z[i] >= estimate) buf[c++] = z[i];
        }
    }
    if (c < k) { /* no estimate, or too high a one */
        memcpy(buf, z, sizeof(float) * n);
        c = n;
    }
    select_largest(buf, c, k);
    float kth = buf[0];
    for (int64_t j = 1; j < k; j++) kth = buf[j] < kth ? buf[j] : kth;
    return kth;
}

/* w[i] = exp(z[i]) where z[i] >= floor and z[i] is finite (at least -87), else 0; their sum
 * (row_mass). */
static double row_weights(const float *z, int64_t n, float floor, float *w) {
    const float low = floor > -87.0f ? floor : -87.0f;
    int64_t i = 0;
    for (; i + EW <= n; i += EW) {
        const ev x = ev_load(z + i);
        const ev e = ev_select((evi)(x >= ev_splat(low)), vexp_nonpositive(x), ev_splat(0.0f));
        memcpy(w + i, &e, sizeof e);
    }
    if (i < n) {
        ev x = ev_splat(-INFINITY);
        memcpy(&x, z + i, sizeof(float) * (n - i));
        const ev e = ev_select((evi)(x >= ev_splat(low)), vexp_nonpositive(x), ev_splat(0.0f));
        memcpy(w + i, &e, sizeof(float) * (n - i));
    }
    return row_mass(w, n);
}

/* The logit of the last token of the nucleus of the tokens with weight w (z's exps above the top-k
 * floor, summing to total): the smallest prefix of them in descending order whose share of total
 * reaches top_p, at least one (sampler._last_kept), found without sorting: the value v whose
 * larger values hold less than top_p of the mass and which with its ties reaches it, by a
 * quickselect that keeps each value's weight beside it (expected O(n); a flat row's nucleus spans
 * most of it, and sorting 25,000 values took ~3 ms). The masses are float64 sums in the
 * partitions' order (sampler's cumsum is float32, in sorted order). buf, e: room for n floats. */
static float nucleus_floor(const float *z, const float *w, int64_t n, double total, float top_p,
                           float *buf, float *e) {
    /* Only tokens heavier than tiny can be in it: all the tokens at or under `tiny` together
     * hold at most half of 1 - top_p of the mass, so the nucleus ends among the heavier ones (a
     * peaked row of 128k logits keeps a few hundred). */
    const float tiny = (float)(0.5 * (1.0 - (double)top_p) * total / (double)n);
    int64_t lo = 0, hi = 0;
    for (int64_t i = 0; i < n; i++) {
        if (w[i] > tiny) {
            buf[hi] = z[i];
            e[hi++] = w[i];
        }
    }
    const double target = (double)top_p * total;
    double above = 0.0; /* the mass of the values known to be larger than [lo, hi)'s */
    uint64_t state = PIVOT_SEED;
    for (;;) {
        const float pivot = buf[pivot_at(&state, lo, hi - lo)];
        /* Three ways: [lo, g) larger than the pivot, [g, s) equal, [s, hi) smaller. */
        int64_t g = lo, i = lo, s = hi;
        double larger = 0.0, equal = 0.0;
        while (i < s) {
            const float v = buf[i], weight = e[i];
            if (v > pivot) {
                buf[i] = buf[g], e[i] = e[g];
                buf[g] = v, e[g] = weight;
                larger += weight;
                g++, i++;
            } else if (v < pivot) {
                s--;
                buf[i] = buf[s], e[i] = e[s];
                buf[s] = v, e[s] = weight;
            } else {
                equal += weight;
                i++;
            }
        }
        /* g > lo: above + larger can reach the target with no larger value, where the sums
         * rounded otherwise than the test that moved `above` past the values before */
        if (above + larger >= target && g > lo)
            hi = g; /* the nucleus ends among the larger values */
        else if (above + larger + equal >= target || s == hi)
            return pivot; /* here (or, the sums rounding under top_p, at the smallest) */
        else {
            above += larger + equal;
            lo = s;
        }
    }
}

/* One row's weights w (temperature and filters; the distribution is w over their sum) and their
 * sum, or 0 where the row has nothing to draw: a NaN or +inf logit, or none finite. z, buf, e:
 * room for n floats each. */
static double row_distribution(const float *x, int64_t n, float temperature, int64_t top_k,
                               float top_p, float min_p, float *z, float *w, float *buf,
                               float *e) {
    const float m = row_max_checked(x, n);
    if (m != m || m == -INFINITY) return 0.0;
    for (int64_t i = 0; i < n; i++) z[i] = (x[i] - m) / temperature; /* as torch: the same bits */
    float floor = -INFINITY;
    if (top_k > 0 && top_k < n) floor = kth_largest(z, n, top_k, buf);
    double total = row_weights(z, n, floor, w);
    if (top_p < 1.0f) {
        const float nucleus = nucleus_floor(z, w, n, total, top_p, buf, e);
        if (nucleus > floor) {
            floor = nucleus;
            total = row_weights(z, n, floor, w);
        }
    }
    if (min_p > 0.0f) { /* below min_p times the largest probability: the largest weight is 1 */
        for (int64_t i = 0; i < n; i++)
            if (w[i] < min_p) w[i] = 0.0f;
        total = row_mass(w, n);
    }
    return total;
}

/* The token drawn from weights w[0, n) (their sum: total > 0) with the uniform u in [0, 1). */
static int64_t draw_row(const float *w, int64_t n, double total, double u) {
    /* The first token whose running sum of weights passes u * total: the block it is in, by the
     * blocks' sums, then the token, by the block's weights one at a time. */
    const double target = u * total;
    double cumulative = 0.0;
    int64_t in = -1; /* the block that passes, else (u * total rounded up to the total) the
                      * last with mass, whose last token with mass is drawn */
    int passes = 0;
    for (int64_t b = 0; b < n && !passes; b += DRAW_BLOCK) {
        const int len = n - b < DRAW_BLOCK ? (int)(n - b) : DRAW_BLOCK;
        const double mass = block_mass(w + b, len);
        if (mass == 0.0) continue;
        in = b;
        passes = cumulative + mass > target;
        if (!passes) cumulative += mass;
    }
    int64_t last = -1;
    const int64_t end = in + DRAW_BLOCK < n ? in + DRAW_BLOCK : n;
    for (int64_t i = in; i < end; i++) {
        if (w[i] == 0.0f) continue;
        cumulative += w[i];
        last = i;
        if (passes && cumulative > target) return i;
    }
    return last; /* past the total, or the block's own sums rounding under it: its last token */
}

/* For row r of logits (rows x vocab, row stride ld) with temperature[r] (> 0), top_k[r] (>= vocab
 * or <= 0: off), top_p[r] (1: off) and min_p[r] (0: off): out[r], if out is not NULL, gets a
 * token drawn with the uniform u[r] in [0, 1), or -1 where the row has nothing to draw (see
 * row_distribution); probs (rows x vocab), if not NULL, gets the row's distribution, NaN where
 * it has nothing to draw (as torch's softmax of such a row). Returns 1 if out of memory (nothing
 * written), else 0. One thread. */
int brisk_sample_rows(const float *logits, int64_t ld, int64_t rows, int64_t vocab,
                      const float *temperature, const int64_t *top_k, const float *top_p,
                      const float *min_p, const double *u, int64_t *out, float *probs) {
    float *space = malloc(sizeof(float) * 4 * (size_t)(vocab > 0 ? vocab : 1));
    if (!space) return 1;
    float *z = space, *w = space + vocab, *buf = space + 2 * vocab, *e = space + 3 * vocab;
    for (int64_t r = 0; r < rows; r++) {
        const double total = row_distribution(logits + r * ld, vocab, temperature[r], top_k[r],
                                              top_p[r], min_p[r], z, w, buf, e);
        float *row_probs = probs ? probs + r * vocab : NULL;
        if (row_probs)
            for (int64_t i = 0; i < vocab; i++)
                row_probs[i] = total > 0.0 ? (float)(w[i] / total) : NAN;
        if (out) out[r] = total > 0.0 ? draw_row(w, vocab, total, u[r]) : -1;
    }
    free(space);
    return 0;
}

/* Speculative decoding's rejection sampling (brisk_rejection_rows): the rule of
 * brisklm.speculative.rejection.rejection_sample, row by row. Its ~50 tensor ops took ~0.3-0.45 ms
 * a verification step of one row on 2 vCPUs, more than the bundled draft's five passes. */

/* The first largest of w[0, n) (n >= 1), torch's argmax; -1 where it is a NaN (greedy_tokens:
 * nothing to take). */
static int64_t first_largest(const float *w, int64_t n) {
    float best = 0.0f;
    int64_t at = -1;
    scan_larger(w, 0, n, &best, &at);
    return best != best ? -1 : at;
}

/* A token drawn from the non-negative weights w[0, n) with the uniform u, as inverse_cdf draws:
 * -1 where their sum is not finite and positive (NaN, +inf, or every weight 0). */
static int64_t draw_weights(const float *w, int64_t n, double u) {
    const double total = row_mass(w, n);
    if (!(total > 0.0 && total < INFINITY)) return -1;
    return draw_row(w, n, total, u);
}

/* For each row b of a verification: p (rows x width x vocab) the target's distributions at the
 * row's proposals and after them, q (rows x (width - 1) x vocab) the draft's, or NULL where the
 * proposals are deterministic (q one-hot on each), tokens (rows x (width - 1)) the proposals, the
 * first num_draft[b] of them proposed, greedy[b] whether the row is greedy, accept_u
 * (rows x (width - 1)) the acceptance tests' uniforms, final_u[b] the last draw's; scratch room
 * for vocab floats. A random row accepts proposal x at position j while accept_u * q_j(x) <
 * p_j(x) (float32), then draws its next token from max(p - q, 0) at the rejected position (from p
 * where that has no mass or a NaN, or where every proposal was accepted); a greedy row accepts
 * while the proposal is p's first largest and takes the first largest after them (-1 where
 * that is a NaN: a greedy row whose logits held one). num_accepted[b] gets the count, final[b]
 * the token (-1: nothing to draw). The caller checks that the proposals are tokens (in [0,
 * vocab)). One thread. */
void brisk_rejection_rows(const float *p, const float *q, const int64_t *tokens,
                          const int64_t *num_draft, const uint8_t *greedy, const float *accept_u,
                          const double *final_u, int64_t rows, int64_t width, int64_t vocab,
                          float *scratch, int64_t *num_accepted, int64_t *final) {
    const int64_t k = width - 1;
    for (int64_t b = 0; b < rows; b++) {
        const float *pb = p + b * width * vocab;
        const float *qb = q ? q + b * k * vocab : NULL;
        const int64_t *xb = tokens + b * k;
        const int64_t n = num_draft[b];
        int64_t a = 0;
        if (greedy[b]) {
            while (a < n && xb[a] == first_largest(pb + a * vocab, vocab)) a++;
            num_accepted[b] = a;
            final[b] = first_largest(pb + a * vocab, vocab);
            continue;
        }
        while (a < n) {
            const float px = pb[a * vocab + xb[a]];
            const float qx = qb ? qb[a * vocab + xb[a]] : 1.0f;
            if (!(accept_u[b * k + a] * qx < px)) break;
            a++;
        }
        num_accepted[b] = a;
        const float *pa = pb + a * vocab;
        const float *w = pa;
        if (a < n) { /* rejected: the residual, where it has mass (a NaN kept: then p) */
            for (int64_t i = 0; i < vocab; i++) {
                const float qi = qb ? qb[a * vocab + i] : (i == xb[a] ? 1.0f : 0.0f);
                const float r = pa[i] - qi;
                scratch[i] = r < 0.0f ? 0.0f : r;
            }
            if (row_mass(scratch, vocab) > 0.0) w = scratch;
        }
        final[b] = draw_weights(w, vocab, final_u[b]);
    }
}
