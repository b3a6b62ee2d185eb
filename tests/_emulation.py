"""Kernels run on the CPU: a rendered kernel compiled for the host by g++ (AddressSanitizer
and UBSan on: an out-of-bounds or misaligned access aborts), its inline PTX (the streaming
load, movmatrix, mma.sync m16n8k16, griddepcontrol) replaced by C++ that follows the PTX
ISA, each CUDA thread one of a pool of std::threads (kept for the run, one for each CUDA
thread of a block or cluster), each __syncthreads() a barrier of the block's
threads and each warp-level operation an exchange among the warp's 32 threads (a warp
that does not arrive whole hangs, and the test times out). Blocks run one after another,
in a shuffled order (which slice of a split-K finishes last varies), their shared memory
NaN at the start; the blocks of a cluster (a split-K summed across one) run together,
cooperative_groups' cluster barrier and distributed shared memory emulated. It checks every index, edge, layout, split-K sum, barrier placement and
epilogue of the source; what it cannot check (timing, the memory model, the real
instructions' rounding) is the GPU tests'. Used by tests/test_decode_family.py and
tests/test_emulated.py (tests/_wgmma_emulation.py builds on it for the wgmma family)."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np

from codegen import render
from codegen.families import Family
from codegen.families._common import Layout

#: the C++ both emulations run their CUDA threads on (tests/_wgmma_emulation.py too)
THREADS = r"""
// a barrier whose waiters sleep at once: std::barrier spins on sched_yield first, and with
// hundreds of emulated threads on two cores those spins took three quarters of the time
struct EmuBarrier {
    std::mutex mu;
    std::condition_variable cv;
    const int count;
    int arrived = 0;
    unsigned long long gen = 0;
    explicit EmuBarrier(int n) : count(n) {}
    void arrive_and_wait()
    {
        std::unique_lock<std::mutex> lk(mu);
        const unsigned long long g = gen;
        if (++arrived == count) {
            arrived = 0;
            ++gen;
            cv.notify_all();
            return;
        }
        cv.wait(lk, [&] { return gen != g; });
    }
};
// the OS threads that run the emulated ones, kept for the whole run: emu_pool.run(n, fn)
// runs fn(0) ... fn(n - 1) at once, one on each (a thread created per CUDA thread and block
// cost most of a run under AddressSanitizer)
struct EmuPool {
    std::mutex mu;
    std::condition_variable go, done;
    std::vector<std::thread> ts;
    const std::function<void(int)>* job = nullptr;
    int n = 0, left = 0;
    unsigned long long round = 0;
    bool quit = false;
    void run(int count, const std::function<void(int)>& fn)
    {
        std::unique_lock<std::mutex> lk(mu);
        while (static_cast<int>(ts.size()) < count)
            ts.emplace_back([this, i = static_cast<int>(ts.size())] { work(i); });
        job = &fn;
        n = left = count;
        ++round;
        go.notify_all();
        done.wait(lk, [&] { return left == 0; });
    }
    void work(int i)
    {
        unsigned long long seen = 0;
        std::unique_lock<std::mutex> lk(mu);
        for (;;) {
            go.wait(lk, [&] { return quit || (round != seen && i < n); });
            if (quit)
                return;
            seen = round;
            const std::function<void(int)>& fn = *job;
            lk.unlock();
            fn(i);
            lk.lock();
            if (--left == 0)
                done.notify_one();
        }
    }
    ~EmuPool()
    {
        {
            std::lock_guard<std::mutex> lk(mu);
            quit = true;
        }
        go.notify_all();
        for (auto& t : ts)
            t.join();
    }
};
static EmuPool emu_pool;
"""

_SHIM = r"""
// Host emulation of the CUDA the decode kernels use (tests/test_decode_family.py).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <type_traits>
#include <vector>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
""" + THREADS + r"""
struct EmuWarp {
    EmuBarrier bar{32};
    unsigned u[32][8];
    float f[32];
    double wa[256], wb[256], wc[256];  // a WMMA product's A, B and C, whole, while it runs
};
// a thread's cp.async groups (committed, oldest first) and the copies not yet committed;
// a copy lands only when a wait_group retires its group: a read of a slot before its wait
// sees what was there (NaN at first)
struct EmuCopy { void* dst; const void* src; int size, bytes; };
thread_local std::vector<std::vector<EmuCopy>> emu_groups;
thread_local std::vector<EmuCopy> emu_open;
// a cp.async of `size` bytes, `bytes` of them read (the rest zeros); both ends aligned to
// `size` where anything is read
static inline void emu_copy(const char* what, void* dst, const void* src, int size, int bytes)
{
    if (reinterpret_cast<std::uintptr_t>(dst) % size
        || (bytes && reinterpret_cast<std::uintptr_t>(src) % size)) {
        std::fprintf(stderr, "%s: %p <- %p is not %d-byte aligned\n", what, dst, src, size);
        std::abort();
    }
    emu_open.push_back({dst, src, size, bytes});
}
static inline void emu_commit()
{
    emu_groups.push_back(std::move(emu_open));
    emu_open.clear();
}
template <int N>
static inline void emu_wait()  // the groups beyond the newest N land, oldest first
{
    while (emu_groups.size() > static_cast<size_t>(N)) {
        for (const EmuCopy& c : emu_groups.front()) {  // src-size bytes, zeros to cp-size
            std::memcpy(c.dst, c.src, c.bytes);
            std::memset(static_cast<char*>(c.dst) + c.bytes, 0, c.size - c.bytes);
        }
        emu_groups.erase(emu_groups.begin());
    }
}
struct EmuCluster;
struct EmuBlock {
    EmuBarrier bar;
    std::vector<EmuWarp> warps;
    std::vector<float> smem;  // its dynamic shared memory: NaN, nothing written yet
    int rank = 0;             // in its cluster
    EmuCluster* cluster = nullptr;
    EmuBlock(int threads, size_t floats) : bar(threads), warps(threads / 32), smem(floats, NAN) {}
};
// a cluster's blocks run together: one barrier of all their threads
struct EmuCluster {
    EmuBarrier bar;
    std::vector<EmuBlock*> blocks;
    explicit EmuCluster(int threads) : bar(threads) {}
};
thread_local EmuBlock* emu_block;
thread_local dim3 emu_tid, emu_bid;
dim3 emu_grid, emu_bdim;
#define threadIdx emu_tid
#define blockIdx emu_bid
#define gridDim emu_grid
#define blockDim emu_bdim
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
using std::min;
using std::max;

static inline EmuWarp& emu_warp() { return emu_block->warps[emu_tid.x / 32]; }
static inline int emu_lane() { return static_cast<int>(emu_tid.x % 32); }
static inline void __syncthreads() { emu_block->bar.arrive_and_wait(); }
static inline void __syncwarp(unsigned = 0xffffffffu) { emu_warp().bar.arrive_and_wait(); }
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline unsigned atomicAdd(unsigned* p, unsigned v)
{
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
static inline float __ldcg(const float* p) { return *p; }
static inline float2 __ldcg(const float2* p) { return *p; }
static inline float4 __ldcg(const float4* p) { return *p; }
static inline float __uint_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
// the SFU's approximations (a few ulp on the GPU), exactly here
#define __expf(x) std::exp(x)  // a macro: glibc declares a __expf of its own
static inline float __fdividef(float x, float y) { return x / y; }
static inline float __shfl_xor_sync(unsigned, float v, int x)
{
    EmuWarp& w = emu_warp();
    const int l = emu_lane();
    w.f[l] = v;
    w.bar.arrive_and_wait();
    const float r = w.f[l ^ x];
    w.bar.arrive_and_wait();
    return r;
}
"""

#: the inline-PTX helpers, as the PTX ISA defines them
_PTX = {
    # griddepcontrol: the emulation runs one grid, block after block, nothing before it
    "dependent_launch_begin": r"""inline void dependent_launch_begin() {}""",
    # a hint the kernel reads nothing from; here a byte read at the address, so that the
    # sanitizer catches one outside the operands
    "prefetch_l2": r"""inline void prefetch_l2(const void* p)
{
    volatile unsigned char byte = *static_cast<const unsigned char*>(p);
    (void)byte;
}""",
    "ld_stream": r"""template <int V>
inline void ld_stream(unsigned* r, const unsigned short* p)
{
    if (reinterpret_cast<std::uintptr_t>(p) % (2 * V)) {
        std::fprintf(stderr, "ld_stream: %p is not %d-byte aligned\n", (const void*)p, 2 * V);
        std::abort();
    }
    std::memcpy(r, p, 2 * V);
}""",
    "cp_async_b16": r"""template <int V, bool STREAM>
inline void cp_async_b16(unsigned* dst, const unsigned short* src, bool pred)
{
    emu_copy("cp_async_b16", dst, src, 2 * V, pred ? 2 * V : 0);
}""",
    # the CUDA-core family's cp.async: a float, or V of them, landing at the wait that
    # retires their group, as the decode ring's copies do
    "cp_async_f32": r"""inline void cp_async_f32(float* dst, const float* src, bool pred)
{
    emu_copy("cp_async_f32", dst, src, 4, pred ? 4 : 0);
}""",
    "cp_async_vec": r"""template <int V>
inline void cp_async_vec(float* dst, const float* src)
{
    emu_copy("cp_async_vec", dst, src, 4 * V, 4 * V);
}""",
    "cp_async_commit": r"""inline void cp_async_commit() { emu_commit(); }""",
    "cp_async_wait": r"""template <int N>
inline void cp_async_wait() { emu_wait<N>(); }""",
    # the WMMA family's helpers: cp.async of BYTES, the block and thread indices, the
    # optimizer's fences (nothing here), fragments from shared memory (wmma's own load)
    "cp_async_bytes": r"""template <int BYTES>
inline void cp_async_bytes(void* dst, const void* src)
{
    emu_copy("cp_async_bytes", dst, src, BYTES, BYTES);
}""",
    "ctaid_x": r"""inline int ctaid_x() { return static_cast<int>(emu_bid.x); }""",
    "tid_x": r"""inline int tid_x() { return static_cast<int>(emu_tid.x); }""",
    "opaque": r"""template <typename X>
inline X opaque(X x) { return x; }""",
    "load_a": r"""inline void load_a(FragA& f, const T* p, unsigned ldm)
{
    wmma::load_matrix_sync(f, p, ldm);
}""",
    "load_b": r"""inline void load_b(FragB& f, const T* p, unsigned ldm)
{
    wmma::load_matrix_sync(f, p, ldm);
}""",
    "ring_commit": r"""inline void ring_commit() { emu_commit(); }""",
    "ring_wait": r"""template <int N>
inline void ring_wait() { emu_wait<N>(); }""",
    "transpose_b16": r"""inline unsigned transpose_b16(unsigned x)
{
    // lane l holds row l/4, columns 2(l%4) and 2(l%4)+1 (low half first) of an 8x8 matrix
    EmuWarp& w = emu_warp();
    const int l = emu_lane();
    w.u[l][0] = x;
    w.bar.arrive_and_wait();
    auto at = [&](int row, int col) {
        return (w.u[4 * row + col / 2][0] >> (16 * (col % 2))) & 0xffffu;
    };
    const int g = l / 4, t = l % 4;
    const unsigned y = at(2 * t, g) | (at(2 * t + 1, g) << 16);  // the transpose's row g
    w.bar.arrive_and_wait();
    return y;
}""",
    "mma_16816": r"""inline void mma_16816(float* d, unsigned a0, unsigned a1, unsigned a2,
                      unsigned a3, unsigned b0, unsigned b1)
{
    EmuWarp& w = emu_warp();
    const int l = emu_lane();
    const unsigned in[6] = {a0, a1, a2, a3, b0, b1};
    std::memcpy(w.u[l], in, sizeof in);
    w.bar.arrive_and_wait();
    auto el = [&](int lane, int reg, int half) {
        const unsigned short bits = (w.u[lane][reg] >> (16 * half)) & 0xffffu;
        T v;
        std::memcpy(&v, &bits, 2);
        return static_cast<double>(static_cast<float>(v));
    };
    // A (16x16): row r, column k in lane 4(r%8) + (k%8)/2, register (r>=8) + 2(k>=8);
    // B (16x8): row k, column n in lane 4n + (k%8)/2, register 4 + (k>=8); half k%2
    auto a = [&](int r, int k) { return el(4 * (r % 8) + (k % 8) / 2, (r >= 8) + 2 * (k >= 8), k % 2); };
    auto b = [&](int k, int n) { return el(4 * n + (k % 8) / 2, 4 + (k >= 8), k % 2); };
    const int g = l / 4, t = l % 4;
    for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e / 2), col = 2 * t + e % 2;  // d0, d1: row g; d2, d3: g+8
        double s = 0.0;
        for (int k = 0; k < 16; ++k)
            s += a(row, k) * b(k, col);
        d[e] = static_cast<float>(d[e] + s);
    }
    w.bar.arrive_and_wait();
}""",
}

#: nvcuda::wmma on the emulated warps: a fragment holds R x C / 32 elements a lane (element
#: e of lane l is element l * num_elements + e of its matrix, row by row: any bijection
#: serves, the kernels touch fragments only through these calls and elementwise); the
#: loads and stores are each lane's own, mma_sync an exchange through the warp
_WMMA = r"""
namespace nvcuda { namespace wmma {
struct matrix_a; struct matrix_b; struct accumulator; struct row_major; struct col_major;
enum layout_t { mem_row_major, mem_col_major };
namespace precision { struct tf32; }
template <typename X> struct emu_storage { using type = X; };
template <> struct emu_storage<precision::tf32> { using type = float; };
template <typename Use, int M, int N, int K> struct emu_shape;
template <int M, int N, int K> struct emu_shape<matrix_a, M, N, K> { static constexpr int R = M, C = K; };
template <int M, int N, int K> struct emu_shape<matrix_b, M, N, K> { static constexpr int R = K, C = N; };
template <int M, int N, int K> struct emu_shape<accumulator, M, N, K> { static constexpr int R = M, C = N; };
template <typename Use, int M, int N, int K, typename X, typename Layout = void>
struct fragment {
    static constexpr int R = emu_shape<Use, M, N, K>::R, C = emu_shape<Use, M, N, K>::C;
    static constexpr int num_elements = R * C / 32;
    static constexpr bool col = std::is_same_v<Layout, col_major>;
    typename emu_storage<X>::type x[num_elements];
    static int row(int e) { return (emu_lane() * num_elements + e) / C; }
    static int column(int e) { return (emu_lane() * num_elements + e) % C; }
};
template <typename F, typename V> inline void fill_fragment(F& f, V v)
{
    for (int e = 0; e < F::num_elements; ++e) f.x[e] = v;
}
template <typename F, typename P> inline void load_matrix_sync(F& f, const P* p, unsigned ldm)
{
    for (int e = 0; e < F::num_elements; ++e)
        f.x[e] = p[F::col ? F::column(e) * ldm + F::row(e) : F::row(e) * ldm + F::column(e)];
}
template <typename F> inline void load_matrix_sync(F& f, const float* p, unsigned ldm, layout_t l)
{
    for (int e = 0; e < F::num_elements; ++e)
        f.x[e] = p[l == mem_col_major ? F::column(e) * ldm + F::row(e) : F::row(e) * ldm + F::column(e)];
}
template <typename F> inline void store_matrix_sync(float* p, const F& f, unsigned ldm, layout_t l)
{
    for (int e = 0; e < F::num_elements; ++e)
        p[l == mem_col_major ? F::column(e) * ldm + F::row(e) : F::row(e) * ldm + F::column(e)] = f.x[e];
}
template <typename D, typename A, typename B, typename Cf>
inline void mma_sync(D& d, const A& a, const B& b, const Cf& c)
{
    EmuWarp& w = emu_warp();
    for (int e = 0; e < A::num_elements; ++e)
        w.wa[A::row(e) * A::C + A::column(e)] = static_cast<double>(static_cast<float>(a.x[e]));
    for (int e = 0; e < B::num_elements; ++e)
        w.wb[B::row(e) * B::C + B::column(e)] = static_cast<double>(static_cast<float>(b.x[e]));
    for (int e = 0; e < Cf::num_elements; ++e)
        w.wc[Cf::row(e) * Cf::C + Cf::column(e)] = c.x[e];
    w.bar.arrive_and_wait();
    float out[D::num_elements];
    for (int e = 0; e < D::num_elements; ++e) {
        const int r = D::row(e), col = D::column(e);
        double s = 0.0;
        for (int k = 0; k < A::C; ++k)
            s += w.wa[r * A::C + k] * w.wb[k * B::C + col];
        out[e] = static_cast<float>(w.wc[r * D::C + col] + s);
    }
    w.bar.arrive_and_wait();
    for (int e = 0; e < D::num_elements; ++e) d.x[e] = out[e];
}
inline float __float_to_tf32(float x)  // cvt.rna.tf32.f32: 10 mantissa bits, ties away
{
    unsigned u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
    std::memcpy(&x, &u, 4);
    return x;
}
} }  // namespace nvcuda::wmma
"""

#: cooperative_groups' cluster on the emulated one: its barrier, this block's rank, and a
#: peer's shared memory at the same offset (distributed shared memory)
_CG = r"""
namespace cooperative_groups {
struct cluster_group {
    void sync() const { emu_block->cluster->bar.arrive_and_wait(); }
    unsigned block_rank() const { return static_cast<unsigned>(emu_block->rank); }
    template <typename T>
    T* map_shared_rank(T* p, int r) const
    {
        const auto off = reinterpret_cast<const char*>(p)
                         - reinterpret_cast<const char*>(emu_block->smem.data());
        return reinterpret_cast<T*>(
            reinterpret_cast<char*>(emu_block->cluster->blocks.at(r)->smem.data()) + off);
    }
};
inline cluster_group this_cluster() { return {}; }
}  // namespace cooperative_groups
"""

_HARNESS = r"""
template <typename E>
static std::vector<E> emu_read(const char* path)
{
    FILE* f = std::fopen(path, "rb");
    if (!f) { std::perror(path); std::exit(2); }
    std::fseek(f, 0, SEEK_END);
    const long bytes = std::ftell(f);
    std::fseek(f, 0, SEEK_SET);
    std::vector<E> v(bytes / sizeof(E));
    if (std::fread(v.data(), 1, bytes, f) != static_cast<size_t>(bytes)) std::exit(2);
    std::fclose(f);
    return v;
}

template <typename F>
static void emu_run_block(F&& body, dim3 bid, int threads)
{
    EmuBlock blk(threads, EMU_SMEM_FLOATS);
    emu_pool.run(threads, [&](int i) {
        emu_groups.clear();  // a fresh thread's: nothing in flight
        emu_open.clear();
        emu_block = &blk;
        emu_tid = dim3(i, 0, 0);
        emu_bid = bid;
        body();
    });
}

// the `size` blocks (x, y, 0 .. size-1) of a cluster along z, their threads together
template <typename F>
static void emu_run_cluster(F&& body, dim3 origin, int threads, int size)
{
    EmuCluster cl(threads * size);
    std::vector<std::unique_ptr<EmuBlock>> blks;
    for (int r = 0; r < size; ++r) {
        blks.push_back(std::make_unique<EmuBlock>(threads, EMU_SMEM_FLOATS));
        blks.back()->rank = r;
        blks.back()->cluster = &cl;
        cl.blocks.push_back(blks.back().get());
    }
    emu_pool.run(threads * size, [&](int j) {
        const int r = j / threads, i = j % threads;
        emu_groups.clear();
        emu_open.clear();
        emu_block = blks[r].get();
        emu_tid = dim3(i, 0, 0);
        emu_bid = dim3(origin.x, origin.y, r);
        body();
    });
}

int main(int argc, char** argv)
{
    const int M = std::atoi(argv[1]), N = std::atoi(argv[2]), K = std::atoi(argv[3]);
    const int batch = std::atoi(argv[4]), lda = std::atoi(argv[5]), ldb = std::atoi(argv[6]);
    const int ldc = std::atoi(argv[7]);
    const long long sA = std::atoll(argv[8]), sB = std::atoll(argv[9]), sC = std::atoll(argv[10]);
    const float alpha = std::atof(argv[11]), beta = std::atof(argv[12]);
    std::vector<T> A = emu_read<T>(argv[14]);
    std::vector<T> B = emu_read<T>(argv[15]);
    std::vector<OutT> C = emu_read<OutT>(argv[16]);
    std::vector<BiasT> bias = emu_read<BiasT>(argv[17]);
    const BiasT* const bp = bias.empty() ? nullptr : bias.data();
    const int tiles = ((M + TILE_M - 1) / TILE_M) * ((N + BN - 1) / BN);
    const int gx = GRID_X;  // the tiles, or stream-K's block slots
    // unwritten: NaN (split-K's partial tiles, or stream-K's two a block)
    std::vector<float> W(std::max(static_cast<size_t>(batch) * SPLIT_K * M * N,
                                  static_cast<size_t>(batch) * gx * 2 * W_TILE), NAN);
    std::vector<unsigned> tickets(static_cast<size_t>(tiles) * batch, 0u);
    std::vector<dim3> order;  // blocks, or with a cluster of the slices, its first block
    for (int z = 0; z < (CLUSTER_Z > 1 ? 1 : SPLIT_K); ++z)
        for (int y = 0; y < batch; ++y)
            for (int x = 0; x < gx; ++x)
                order.push_back(dim3(x, y, z));
    std::shuffle(order.begin(), order.end(), std::mt19937(std::atoi(argv[13])));
    emu_grid = dim3(gx, batch, SPLIT_K);
    emu_bdim = dim3(THREADS, 1, 1);
    const auto body = [&] { KERNEL(M, N, K, alpha, A.data(), lda, sA, B.data(), ldb, sB, beta,
                                   C.data(), ldc, sC, bp EXTRA_ARGS); };
    for (const dim3& bid : order) {
        if (CLUSTER_Z > 1)
            emu_run_cluster(body, bid, THREADS, CLUSTER_Z);
        else
            emu_run_block(body, bid, THREADS);
    }
    REDUCE_PASS
    for (unsigned x : tickets)
        if (x) { std::fprintf(stderr, "a ticket was left at %u\n", x); return 3; }
    FILE* f = std::fopen(argv[16], "wb");
    std::fwrite(C.data(), sizeof(OutT), C.size(), f);
    std::fclose(f);
    return 0;
}
"""

_REDUCE_PASS = r"""const int rx = (M * N + 255) / 256;
    emu_grid = dim3(rx, batch, 1);
    emu_bdim = dim3(256, 1, 1);
    for (int y = 0; y < batch; ++y)
        for (int x = 0; x < rx; ++x)
            emu_run_block([&] { KERNEL_reduce(M, N, alpha, W.data(), beta, C.data(), ldc, sC,
                                              bp); }, dim3(x, y, 0), 256);"""


def _without(src: str, name: str, table: dict | None = None) -> str:
    """`src` with the definitions of device function `name` (each overload) replaced by
    its emulation (in `table`, default _PTX)."""
    table = _PTX if table is None else table
    lines, first = src.split("\n"), True
    while True:
        start = next((i for i, line in enumerate(lines)
                      if re.match(rf"__device__ __forceinline__ [\w:]+ {name}\(", line)), None)
        if start is None:
            return "\n".join(lines)
        if lines[start - 1].startswith("template"):
            start -= 1
        end = next(j for j in range(start, len(lines)) if lines[j] == "}")
        lines[start:end + 1] = table[name].split("\n") if first else []
        first = False


def emulation_source(cfg, src: str | None = None, slots: int = 3) -> str:
    """The rendered kernel (a decode, CUDA-core or WMMA config), or `src` (its source as a
    library ships it), as a host program (see the module doc): its dynamic shared memory
    the block's, its inline PTX replaced by _PTX's C++, and a main() that runs every block
    of the grid (a stream-K kernel's: `slots` blocks, the GPU's block slots)."""
    src = render(cfg) if src is None else src
    for name in _PTX:
        if re.search(rf"__forceinline__ [\w:]+ {name}\(", src):
            src = _without(src, name)
    src, found = re.subn(r"extern __shared__ __align__\(\d+\) ([\w ]+?) (\w+)\[\];",
                         r"\1* const \2 = reinterpret_cast<\1*>(emu_block->smem.data());", src)
    assert found == 1, "one dynamic shared array"
    if "#include <mma.h>" in src:  # the WMMA family: wmma's API on the emulated warps
        src = src.replace("#include <mma.h>", _WMMA)
    # a cluster split-K: cooperative_groups' cluster calls on the emulated cluster
    src = src.replace("#include <cooperative_groups.h>", _CG).replace(
        "__cluster_dims__(1, 1, SPLIT) ", "")
    assert not re.search(r"\basm\b", re.sub(r"//.*", "", src)), "inline PTX left"
    extra = (", W.data()" if cfg.has_workspace else "") + (", tickets.data()" if cfg.last else "")
    harness = (_HARNESS.replace("REDUCE_PASS", _REDUCE_PASS if cfg.reduce_pass else "")
               .replace("KERNEL", cfg.name).replace(" EXTRA_ARGS", extra)
               .replace("SPLIT_K", str(cfg.split))
               .replace("GRID_X", str(slots) if getattr(cfg, "streamk", 0) else "tiles")
               .replace("W_TILE", str(cfg.bm * cfg.bn) if getattr(cfg, "streamk", 0) else "0")
               .replace("CLUSTER_Z", str(cfg.split if getattr(cfg, "cluster", False) else 1))
               .replace("TILE_M", "MT" if cfg.family is Family.DECODE else "BM"))
    return (_SHIM + f"constexpr size_t EMU_SMEM_FLOATS = {-(-cfg.smem_bytes // 4)};\n" + src
            + harness)


def cuda_include() -> Path | None:
    """The CUDA toolkit's headers (cuda_fp16.h, cuda_bf16.h: their host-side types): under
    $CUDA_HOME, $CUDA_PATH, beside nvcc or in /usr/local/cuda; None where none is."""
    import os

    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.insert(2, str(Path(nvcc).resolve().parent.parent))
    return next((Path(r) / "include" for r in roots
                 if r and (Path(r) / "include" / "cuda_fp16.h").is_file()), None)


CXX = ["g++", "-std=c++20", "-O1", "-pthread", "-w", "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all"]


def build_all(configs, where: Path) -> dict:
    """{config: its emulation's executable}, compiled two at a time into `where` (pytest's
    failure, not a skip, where g++ or the CUDA headers are missing: the emulation is this
    machine's only run of these kernels)."""
    import concurrent.futures as cf

    import pytest

    if not shutil.which("g++") or cuda_include() is None:
        pytest.fail("the emulation needs g++ and the CUDA toolkit's headers")
    with cf.ThreadPoolExecutor(2) as pool:
        return dict(zip(configs, pool.map(lambda c: build(c, where), configs)))


def build(cfg, where: Path, source: str | None = None, name: str | None = None,
          slots: int = 3) -> Path:
    """`cfg`'s emulation (or `source`, an edited one; a stream-K kernel on `slots` blocks)
    compiled by g++ into `where` as `name` (default: the kernel's): the executable."""
    name = name or cfg.name
    cpp, exe = where / f"{name}.cpp", where / name
    cpp.write_text(emulation_source(cfg, slots=slots) if source is None else source)
    r = subprocess.run(CXX + [f"-I{cuda_include()}", str(cpp), "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    return exe


def _bits(x: np.ndarray, t: str) -> np.ndarray:
    """Values exactly representable in `t` (f16, bf16), as their 16 bits."""
    if t == "f16":
        return np.asarray(x).astype(np.float16).view(np.uint16)
    return (np.asarray(x).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _values(bits: np.ndarray, t: str) -> np.ndarray:
    if t == "f16":
        return bits.view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _rounded(x: np.ndarray, t: str) -> np.ndarray:
    """x rounded to C's type `t` (f32, f16; bf16 by truncation: any bf16 values do)."""
    if t == "f32":
        return x.astype(np.float32).astype(np.float64)
    return _values(_bits(x, t), t)


def _stored(x: np.ndarray, t: str) -> np.ndarray:
    return x.astype(np.float32) if t == "f32" else _bits(x, t)


def laid_out(rng, batch, rows, cols, col_major, t, ld, stride):
    """A batch x rows x cols operand of random values of type `t`, stored row- or
    column-major with leading dimension `ld`, problems `stride` elements apart (0: one
    matrix the batch shares): (its bits, float64 values)."""
    srows, scols = (cols, rows) if col_major else (rows, cols)
    copies = batch if stride else 1
    flat = np.zeros((copies - 1) * stride + srows * ld)
    values = np.zeros((batch, rows, cols))
    for i in range(copies):
        v = _rounded(rng.standard_normal((srows, scols)), t)
        for r in range(srows):
            flat[i * stride + r * ld: i * stride + r * ld + scols] = v[r]
        values[i if stride else slice(None)] = v.T if col_major else v
    return _stored(flat, t), values


def _operand(rng, batch, rows, cols, col_major, t, pad, broadcast=False):
    """A batch x rows x cols operand stored row- or column-major with `pad` elements past
    each stored row and 3 between problems: (its bits, float64 values, ld, stride)."""
    srows, scols = (cols, rows) if col_major else (rows, cols)
    ld = scols + pad
    stride = 0 if broadcast else srows * ld + 3
    return (*laid_out(rng, batch, rows, cols, col_major, t, ld, stride), ld, stride)


def _activate(x: np.ndarray, act: str) -> np.ndarray:
    if act == "relu":
        return np.maximum(x, 0)
    if act == "gelu":
        return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    if act == "gelu_tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    if act == "silu":
        return x / (1 + np.exp(-x))
    return x


def one_cpu():
    """A preexec_fn that keeps an emulation's process on one CPU, this pytest-xdist worker's
    (gwN: the Nth of the CPUs allowed, so two workers take two). Its hundreds of threads
    meet at barriers all the time: spread over two CPUs, the wakeups and migrations cost
    twice the CPU time (14.4 against 6.7 CPU-s for one run of a cluster split-K kernel)."""
    cpus = sorted(os.sched_getaffinity(0))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    cpu = cpus[int(worker[2:] or 0) % len(cpus)]
    return lambda: os.sched_setaffinity(0, {cpu})


def emulate(exe: Path, cfg, shape, where: Path, batch=1, alpha=1.0, beta=0.0,
            pads=(0, 0, 2), broadcast_b=False, seed=0, order=None, raw=None):
    """Run `exe` on fresh operands of cfg's variant (drawn from `seed`), C poisoned with
    NaN, its blocks in the order `order` shuffles them to (default: `seed`): (relative
    error against the float64 reference, padding of C untouched?). C's bits are appended
    to `raw` where given."""
    m, n, k = shape
    rng = np.random.default_rng(seed)
    t, out = {"tf32": "f32"}.get(cfg.dtype.short, cfg.dtype.short), cfg.out.short
    a, av, lda, sa = _operand(rng, batch, m, k, cfg.layout in (Layout.TN, Layout.TT), t, pads[0])
    b, bv, ldb, sb = _operand(rng, batch, k, n, cfg.layout in (Layout.NT, Layout.TT), t,
                              pads[1], broadcast_b)
    ldc = n + pads[2]
    sc = m * ldc + 1
    c0 = _rounded(rng.standard_normal((batch, m, n)), out)
    cflat = np.full((batch - 1) * sc + m * ldc, np.nan)
    for i in range(batch):
        for r in range(m):
            cflat[i * sc + r * ldc: i * sc + r * ldc + n] = c0[i, r] if beta else np.nan
    bias_t = "f32" if cfg.bias == "f32" else out
    bias = _rounded(rng.standard_normal(n if cfg.bias != "none" else 0), bias_t)
    for name, x in (("a", a), ("b", b), ("c", _stored(cflat, out)), ("bias",
                                                                       _stored(bias, bias_t))):
        x.tofile(where / name)
    args = (m, n, k, batch, lda, ldb, ldc, sa, sb, sc, alpha, beta,
            seed if order is None else order)
    r = subprocess.run([str(exe), *map(str, args), *(str(where / x) for x in
                                                     ("a", "b", "c", "bias"))],
                       capture_output=True, text=True, timeout=300, preexec_fn=one_cpu())
    assert r.returncode == 0, r.stderr[-3000:]
    bits = np.fromfile(where / "c", dtype=np.float32 if out == "f32" else np.uint16)
    if raw is not None:
        raw.append(bits)
    return compared(bits, out, av, bv, c0, bias, alpha, beta, cfg.act, ldc, sc)


def compared(bits, out: str, av, bv, c0, bias, alpha, beta, act, ldc, sc) -> tuple:
    """C's `bits` (type `out`; batch x M rows of ldc, problems sc apart) against
    act(alpha A B + beta C0 + bias) in float64: (relative error, the elements past N in
    each row still NaN?)."""
    batch, m, n = c0.shape
    got = bits.astype(np.float64) if out == "f32" else _values(bits, out)
    ref = alpha * np.matmul(av, bv) + (beta * c0 if beta else 0) + (bias if len(bias) else 0)
    ref = _activate(ref, act)
    rows = [got[i * sc + r * ldc: i * sc + (r + 1) * ldc] for i in range(batch)
            for r in range(m)]
    res = np.stack([row[:n] for row in rows]).reshape(batch, m, n)
    untouched = all(np.isnan(row[n:]).all() for row in rows)
    return float(np.linalg.norm(res - ref) / max(np.linalg.norm(ref), 1e-30)), untouched
