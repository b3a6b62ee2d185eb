"""The wgmma family's kernels run on the CPU: a rendered kernel compiled for the host by g++
(AddressSanitizer and UBSan on), its inline PTX replaced by C++ that follows the PTX ISA,
launched as the family's own runner launches it.

What is emulated, and how (the C++ below, `_SHIM`):
- Each CUDA thread is one of a pool of std::threads (tests/_emulation.py's THREADS); a
  cluster's blocks run together, clusters one after another in a shuffled order, each
  block's shared memory NaN at the start.
- TMA (cp.async.bulk.tensor, tensor maps): a load lands in its block (each block of a
  multicast's mask) at one of the two ends of what the ISA allows, as the run says:
  "lazy", only when a thread waits on the mbarrier it signals and the phase is not
  complete (a consumer that reads a stage without waiting for it reads what was there),
  or "eager", as it is issued (a stage refilled while wgmmas that read it are still in
  flight, released too early, is overwritten under them). Boxes are read and written with the 128B,
  64B or 32B swizzle of the shared address's bits, out-of-bounds elements are zeros and
  counted, TFLOAT32 maps round to tf32 (to nearest even). A TMA store is kept in its bulk
  group and made at the wait that retires the group (wait_group.read), the latest: a
  buffer written again before that wait is what the store writes.
- mbarriers: arrivals, expected transaction bytes, phases and parity waits, as the ISA
  has them; one's 8 bytes are marked at init and checked at each use (a tile written
  over a barrier is caught), an arrival beyond the count is an error.
- wgmma.mma_async: kept in the thread's open group; commit_group closes it, and
  wait_group N computes the groups beyond the newest N, reading shared memory (through
  the descriptor: start, LBO, SBO, 128B swizzle, K- or MN-major) and the accumulators
  then, the latest the ISA allows: a stage released before its wgmmas are waited for is
  caught when the producer refills it. The wait is the warpgroup's, as on the GPU: its
  128 threads meet there, compute their parts, and leave together. A register-sourced A
  (tf32) is each thread's fragment as it issued it, gathered from the warpgroup. Products in float64, each wgmma
  rounded once into the FP32 accumulators; tf32 operands keep their top 19 bits, as the
  tensor cores read them.
- Named barriers (bar.sync, bar.arrive, bar.red.or), the cluster's barrier, remote
  arrivals (mapa), stmatrix, warp shuffles: real exchanges among the threads.
- A wait that sees no progress anywhere for EMU_PATIENCE seconds aborts with what it
  waited on (a deadlock); a block that ends with wgmmas or TMA stores in flight aborts.

Launches come from the runner itself (tuner/runtime/runners.py's TmaRunner, bound on a
fake driver that records its launches and tensor maps): grids, clusters, tensor maps,
the pre-pass, split-K's workspace and tickets are the runner's. What this cannot check is
the GPU's: timing, the memory model's weaker orders, the real instructions' rounding.
Used by tests/test_wgmma_emulated.py.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import types
from pathlib import Path

import numpy as np

from _emulation import (CXX, THREADS, _rounded, _stored, _without, compared, cuda_include,
                        laid_out, one_cpu)
from codegen import render
from codegen.families._common import Layout

_SHIM = r"""
// Host emulation of the wgmma family's CUDA (tests/_wgmma_emulation.py)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>
#include <math.h>
#include <sanitizer/asan_interface.h>
#include <cuda.h>
#include <vector_types.h>
#include <vector_functions.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#ifndef EMU_PATIENCE_S
#define EMU_PATIENCE_S 60
#endif
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __shared__ static
#define threadIdx emu_tid
#define blockIdx emu_bid
#define gridDim emu_grid
#define blockDim emu_bdim
using std::min;
using std::max;

constexpr int EMU_PATIENCE = EMU_PATIENCE_S;  // seconds without progress anywhere: a deadlock

[[noreturn]] static void emu_fail(const char* fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
    std::fputc('\n', stderr);
    std::fflush(stderr);
    std::abort();
}

// ---- the emulated machine -------------------------------------------------------------
struct EmuMap {  // what this emulation keeps in a CUtensorMap's 128 bytes
    unsigned char* addr;
    int es, rank, swizzle, round_tf32;
    long long dim[3], stride[2];  // elements; bytes between rows, between problems
    int box[3];
};
static_assert(sizeof(EmuMap) <= sizeof(CUtensorMap), "a map fits a CUtensorMap");

struct EmuBar {  // a named barrier, the cluster's, or a warpgroup's
    int expected = 0, arrived = 0;
    unsigned long long gen = 0;
    bool red = false, result[2] = {false, false};
};
struct EmuMbar {
    unsigned count = 0, pending = 0;
    long long tx = 0;
    unsigned long long phase = 0;
};
struct EmuLoad {
    EmuMap map;
    int c[3];
    uint32_t dst, bar;
};
""" + THREADS + r"""
struct EmuWarp {
    EmuBarrier bar{32};
    uint32_t u[32][5];
};
struct EmuCluster;
struct EmuCta {
    unsigned char* smem = nullptr;
    uint32_t smem_bytes = 0;
    int rank = 0;
    EmuCluster* cluster = nullptr;
    std::unordered_map<uint32_t, EmuMbar> mbars;
    EmuBar named[16], wg[4];
    std::vector<EmuLoad> loads;
    std::map<long long, std::vector<uint32_t>> rs[4];  // per warpgroup: issue -> 128 x 4 registers
    std::unique_ptr<EmuWarp[]> warps;
};
struct EmuCluster {
    std::vector<EmuCta*> ctas;
    EmuBar bar;
};

static std::mutex emu_mu;               // every barrier, queue and TMA copy
static std::condition_variable emu_cv;  // notified at every change a waiter may wait for
thread_local EmuCta* emu_cta;
thread_local dim3 emu_tid, emu_bid;
dim3 emu_grid, emu_bdim;

template <class Done>
static void emu_until(std::unique_lock<std::mutex>& lk, Done done, const char* what, unsigned id)
{
    while (!done())
        if (emu_cv.wait_for(lk, std::chrono::seconds(EMU_PATIENCE)) == std::cv_status::timeout
            && !done())
            emu_fail("deadlock: thread %u of block %u waits on %s %u", emu_tid.x, emu_bid.x, what, id);
}

static unsigned char* emu_at(EmuCta* c, uint32_t addr, uint32_t bytes)
{
    if (static_cast<uint64_t>(addr) + bytes > c->smem_bytes)
        emu_fail("shared address %u (+%u) outside the block's %u bytes", addr, bytes, c->smem_bytes);
    return c->smem + addr;
}

static unsigned char* emu_aligned(uint32_t addr, uint32_t bytes)
{
    if (addr % bytes)
        emu_fail("shared access of %u bytes at %u: misaligned", bytes, addr);
    return emu_at(emu_cta, addr, bytes);
}

// a 2 B-4 B swizzle of the byte address: bits 4.. XOR bits 7.. (Swizzle<3|2|1, 4, 3>)
static uint32_t emu_swizzle(uint32_t a, int span)
{
    const uint32_t mask = span == 128 ? 7 : span == 64 ? 3 : span == 32 ? 1 : 0;
    return a ^ (((a >> 7) & mask) << 4);
}

// ---- barriers --------------------------------------------------------------------------
static bool emu_bar(EmuBar& b, int count, bool flag, bool wait, const char* what, unsigned id)
{
    std::unique_lock<std::mutex> lk(emu_mu);
    if (b.arrived == 0)
        b.expected = count;
    else if (b.expected != count)
        emu_fail("%s %u: %d threads expected, then %d", what, id, b.expected, count);
    b.red |= flag;
    const unsigned long long gen = b.gen;
    if (++b.arrived == count) {
        b.result[gen % 2] = b.red;
        b.red = false;
        b.arrived = 0;
        ++b.gen;
        emu_cv.notify_all();
        return b.result[gen % 2];
    }
    if (!wait)
        return false;
    emu_until(lk, [&] { return b.gen != gen; }, what, id);
    return b.result[gen % 2];
}

static inline void __syncthreads() { emu_bar(emu_cta->named[0], emu_bdim.x, false, true, "bar.sync", 0); }
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
[[noreturn]] static inline void __trap() { emu_fail("__trap() in thread %u of block %u", emu_tid.x, emu_bid.x); }

constexpr unsigned long long EMU_MBAR_MARK = 0x6d62617272696572ull;

static EmuMbar& emu_mbar(EmuCta* c, uint32_t bar)  // under emu_mu
{
    auto it = c->mbars.find(bar);
    if (it == c->mbars.end())
        emu_fail("mbarrier at %u: not initialised", bar);
    unsigned long long w;
    std::memcpy(&w, emu_at(c, bar, 8), 8);
    if (w != EMU_MBAR_MARK)
        emu_fail("mbarrier at %u: its 8 bytes were written over", bar);
    return it->second;
}

static void emu_complete(EmuMbar& m)  // the phase completes with its arrivals and bytes
{
    if (m.pending == 0 && m.tx == 0) {
        ++m.phase;
        m.pending = m.count;
        emu_cv.notify_all();
    }
}

static void emu_arrive(EmuCta* c, uint32_t bar)
{
    EmuMbar& m = emu_mbar(c, bar);
    if (m.pending == 0)
        emu_fail("mbarrier at %u: an arrival beyond its count", bar);
    --m.pending;
    emu_complete(m);
}

// ---- TMA ---------------------------------------------------------------------------------
static void emu_tf32_rne(unsigned char* p)  // a TFLOAT32 map's rounding: to nearest even
{
    uint32_t u;
    std::memcpy(&u, p, 4);
    if ((u & 0x7f800000u) != 0x7f800000u)
        u = (u + 0xfffu + ((u >> 13) & 1u)) & 0xffffe000u;
    std::memcpy(p, &u, 4);
}

// One box between global memory and block c's shared memory at s: its bytes
static unsigned emu_box(const EmuMap& m, const int* co, EmuCta* c, uint32_t s, bool load)
{
    if (s % 128)
        emu_fail("TMA: shared address %u is not 128-byte aligned", s);
    const int rows = m.box[1], cols = m.box[0], rb = cols * m.es;
    for (int r = 0; r < rows; ++r)
        for (int x = 0; x < cols; ++x) {
            unsigned char* sp = emu_at(c, emu_swizzle(s + r * rb + x * m.es, m.swizzle), m.es);
            const long long gc = co[0] + x, gr = co[1] + r, gb = m.rank == 3 ? co[2] : 0;
            const bool in = gc >= 0 && gc < m.dim[0] && gr >= 0 && gr < m.dim[1]
                            && (m.rank < 3 || (gb >= 0 && gb < m.dim[2]));
            unsigned char* gp = in ? m.addr + gr * m.stride[0] + gb * (m.rank == 3 ? m.stride[1] : 0)
                                         + gc * m.es
                                   : nullptr;
            if (load) {
                if (in) {
                    std::memcpy(sp, gp, m.es);
                    if (m.round_tf32)
                        emu_tf32_rne(sp);
                } else {
                    std::memset(sp, 0, m.es);
                }
            } else if (in) {
                std::memcpy(gp, sp, m.es);
            }
        }
    return rows * cols * m.es;
}

static const EmuMap& emu_map(const CUtensorMap* map, bool batched)
{
    const EmuMap& m = *reinterpret_cast<const EmuMap*>(map);
    if (batched != (m.rank == 3))
        emu_fail("TMA: a %s access of a map of rank %d", batched ? "3d" : "2d", m.rank);
    return m;
}

static void emu_land(EmuCta* c, uint32_t bar)  // under emu_mu: the loads that signal bar land
{
    for (size_t i = 0; i < c->loads.size();) {
        if (c->loads[i].bar != bar) {
            ++i;
            continue;
        }
        const EmuLoad ld = c->loads[i];
        c->loads.erase(c->loads.begin() + i);
        EmuMbar& m = emu_mbar(c, bar);
        m.tx -= emu_box(ld.map, ld.c, c, ld.dst, true);
        emu_complete(m);
    }
}

static bool emu_eager;  // TMA loads land as they are issued (else when waited for)

static void emu_queue(EmuCta* c, uint32_t dst, const EmuMap& m, uint32_t bar, int c0, int c1, int c2)
{
    std::lock_guard<std::mutex> lk(emu_mu);
    c->loads.push_back({m, {c0, c1, c2}, dst, bar});
    if (emu_eager)
        emu_land(c, bar);
    emu_cv.notify_all();
}

template <class X>  // a thread's open group of async operations, committed
static void emu_close(std::vector<std::vector<X>>& groups, std::vector<X>& open)
{
    groups.push_back(std::move(open));
    open.clear();
}

struct EmuStore {
    EmuMap map;
    int c[3];
    uint32_t src;
};
thread_local std::vector<std::vector<EmuStore>> emu_bulk_groups;
thread_local std::vector<EmuStore> emu_bulk_open;

static void emu_bulk_retire(size_t keep)
{
    std::lock_guard<std::mutex> lk(emu_mu);
    while (emu_bulk_groups.size() > keep) {
        for (const EmuStore& s : emu_bulk_groups.front())
            emu_box(s.map, s.c, emu_cta, s.src, false);
        emu_bulk_groups.erase(emu_bulk_groups.begin());
    }
}

// ---- wgmma -------------------------------------------------------------------------------
struct EmuMma {
    float* d;
    int n, k, type;  // type: 0 f16, 1 bf16, 2 tf32
    bool scale, ta, tb;
    uint64_t a, b;
    long long seq;  // >= 0: A from the warpgroup's registers, issue `seq`
};
thread_local std::vector<std::vector<EmuMma>> emu_mma_groups;
thread_local std::vector<EmuMma> emu_mma_open;
thread_local long long emu_rs_seq;

static double emu_value(const unsigned char* p, int type)
{
    if (type == 2) {
        uint32_t u;
        std::memcpy(&u, p, 4);
        u &= 0xffffe000u;  // the tensor cores read a tf32's top 19 bits
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
    uint16_t h;
    std::memcpy(&h, p, 2);
    if (type == 1) {
        const uint32_t u = static_cast<uint32_t>(h) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
    __half x;
    std::memcpy(&x, &h, 2);
    return __half2float(x);
}

// The shared address of element (mn, k) of a descriptor's matrix (the ISA's canonical
// layouts, 128B swizzle): K-major rows of 128 B, 8-row groups SBO apart; MN-major rows of
// K of 128 B (128 / es elements of MN), MN blocks LBO apart, 8-row groups of K SBO apart.
static uint32_t emu_desc(uint64_t d, int mn, int k, bool mn_major, int es, int kext)
{
    const uint32_t start = static_cast<uint32_t>(d & 0x3fff) << 4;
    const uint32_t lbo = static_cast<uint32_t>((d >> 16) & 0x3fff) << 4;
    const uint32_t sbo = static_cast<uint32_t>((d >> 32) & 0x3fff) << 4;
    if ((d >> 62) != 1)
        emu_fail("wgmma descriptor: swizzle mode %d (the emulation knows 128B, 1)", static_cast<int>(d >> 62));
    if ((d >> 49) & 7)
        emu_fail("wgmma descriptor: a base offset");
    const int per_row = 128 / es;
    if (mn_major)
        return emu_swizzle(start + (mn / per_row) * lbo + (k / 8) * sbo + (k % 8) * 128
                           + (mn % per_row) * es, 128);
    if (start % 128 + kext * es > 128)
        emu_fail("wgmma descriptor: a K-major k-step past its 128-byte row (start %u)", start);
    return emu_swizzle(start + (mn / 8) * sbo + (mn % 8) * 128 + k * es, 128);
}

static void emu_retire(const EmuMma& op)
{
    const int t = emu_tid.x % 128, w = t / 32, l = t % 32, wgi = emu_tid.x / 128;
    const int es = op.type == 2 ? 4 : 2;
    const uint32_t* rs = nullptr;
    if (op.seq >= 0) {
        std::lock_guard<std::mutex> lk(emu_mu);
        auto it = emu_cta->rs[wgi].find(op.seq);
        if (it == emu_cta->rs[wgi].end())
            emu_fail("wgmma: issue %lld's register operand never gathered", op.seq);
        rs = it->second.data();
    }
    double a[2][16];
    for (int h = 0; h < 2; ++h) {
        const int row = 16 * w + l / 4 + 8 * h;
        for (int k = 0; k < op.k; ++k) {
            if (rs) {  // m64k8 tf32: a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)
                const int owner = 32 * (row / 16) + 4 * (row % 8) + k % 4;
                const uint32_t u = rs[owner * 4 + (row % 16 >= 8) + 2 * (k >= 4)];
                a[h][k] = emu_value(reinterpret_cast<const unsigned char*>(&u), 2);
            } else {
                a[h][k] = emu_value(emu_at(emu_cta, emu_desc(op.a, row, k, op.ta, es, op.k), es), op.type);
            }
        }
    }
    for (int i = 0; i < op.n / 2; ++i) {
        const int h = (i % 4) / 2, col = 8 * (i / 4) + 2 * (l % 4) + i % 2;
        double s = 0.0;
        for (int k = 0; k < op.k; ++k)
            s += a[h][k] * emu_value(emu_at(emu_cta, emu_desc(op.b, col, k, op.tb, es, op.k), es), op.type);
        op.d[i] = static_cast<float>((op.scale ? static_cast<double>(op.d[i]) : 0.0) + s);
    }
}

static void emu_mma_issue(float* d, int n, int k, int type, bool scale, bool ta, bool tb, uint64_t a,
                          uint64_t b, const uint32_t* regs)
{
    long long seq = -1;
    if (regs) {
        seq = emu_rs_seq++;
        std::lock_guard<std::mutex> lk(emu_mu);
        std::vector<uint32_t>& v = emu_cta->rs[emu_tid.x / 128][seq];
        v.resize(128 * 4);
        std::memcpy(&v[(emu_tid.x % 128) * 4], regs, 16);
    }
    emu_mma_open.push_back({d, n, k, type, scale, ta, tb, a, b, seq});
}

static void emu_mma_wait(size_t keep)
{
    // wait_group is the warpgroup's (.sync.aligned): its wgmmas are one operation of the 128
    // threads, done for all when the wait returns in any (whose leader may then release the
    // stage they read). So: all arrive, each computes its part, all leave together.
    if (!emu_mma_open.empty())
        emu_fail("wgmma.wait_group with wgmmas not committed");
    EmuBar& b = emu_cta->wg[emu_tid.x / 128];
    emu_bar(b, 128, false, true, "wgmma.wait_group of warpgroup", emu_tid.x / 128);
    while (emu_mma_groups.size() > keep) {
        for (const EmuMma& op : emu_mma_groups.front())
            emu_retire(op);
        emu_mma_groups.erase(emu_mma_groups.begin());
    }
    emu_bar(b, 128, false, true, "wgmma.wait_group of warpgroup", emu_tid.x / 128);
}

// ---- warps ---------------------------------------------------------------------------
static inline EmuWarp& emu_warp() { return emu_cta->warps[emu_tid.x / 32]; }

template <class X>
static X emu_exchange(X v, int from)
{
    static_assert(sizeof(X) == 4, "a 4-byte value");
    EmuWarp& w = emu_warp();
    const int l = emu_tid.x % 32;
    std::memcpy(&w.u[l][0], &v, 4);
    w.bar.arrive_and_wait();
    X r;
    std::memcpy(&r, &w.u[from % 32][0], 4);
    w.bar.arrive_and_wait();
    return r;
}
template <class X> static inline X __shfl_sync(unsigned, X v, int src) { return emu_exchange(v, src); }
template <class X> static inline X __shfl_xor_sync(unsigned, X v, int x) { return emu_exchange(v, (emu_tid.x % 32) ^ x); }

// ---- what the CUDA headers give device code only --------------------------------------------
static inline float __uint_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned x; std::memcpy(&x, &f, 4); return x; }
static inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
static inline float __ldcg(const float* p) { return *p; }
static inline float2 __ldcg(const float2* p) { return *p; }
static inline float4 __ldcg(const float4* p) { return *p; }
#define __expf(x) std::exp(x)
static inline float __fdividef(float x, float y) { return x / y; }
"""

#: the inline-PTX helpers of the template, as the ISA defines them (`{...}`: the config's
#: values, filled in by `_helpers`)
_PTX = {
    "smem_u32": r"""inline uint32_t smem_u32(const void* p)
{
    return static_cast<uint32_t>(static_cast<const unsigned char*>(p) - emu_cta->smem);
}""",
    "mbar_init": r"""inline void mbar_init(uint32_t bar, uint32_t count)
{
    std::lock_guard<std::mutex> lk(emu_mu);
    if (bar % 8)
        emu_fail("mbarrier at %u: not 8-byte aligned", bar);
    std::memcpy(emu_at(emu_cta, bar, 8), &EMU_MBAR_MARK, 8);
    EmuMbar& m = emu_cta->mbars[bar];
    m = EmuMbar{count, count, 0, 0};
}""",
    "mbar_arrive_expect_tx": r"""inline void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes)
{
    std::lock_guard<std::mutex> lk(emu_mu);
    emu_mbar(emu_cta, bar).tx += bytes;
    emu_arrive(emu_cta, bar);
}""",
    "mbar_wait": r"""inline void mbar_wait(uint32_t bar, uint32_t parity)
{
    std::unique_lock<std::mutex> lk(emu_mu);
    const auto done = [&] {
        emu_land(emu_cta, bar);
        return (emu_mbar(emu_cta, bar).phase & 1) != parity;
    };
    while (!done())
        if (emu_cv.wait_for(lk, std::chrono::seconds(EMU_PATIENCE)) == std::cv_status::timeout && !done()) {
            const EmuMbar& m = emu_mbar(emu_cta, bar);
            emu_fail("deadlock: thread %u of block %u waits on the mbarrier at %u for parity %u "
                     "(phase %llu, %u arrivals and %lld bytes to come; %zu loads queued)", emu_tid.x,
                     emu_bid.x, bar, parity, m.phase, m.pending, m.tx, emu_cta->loads.size());
        }
}""",
    "mbar_arrive": r"""inline void mbar_arrive(uint32_t bar)
{
    std::lock_guard<std::mutex> lk(emu_mu);
    emu_arrive(emu_cta, bar);
}""",
    "mbar_arrive_cluster": r"""inline void mbar_arrive_cluster(uint32_t bar, uint32_t cta)
{
    std::lock_guard<std::mutex> lk(emu_mu);
    if (cta >= emu_cta->cluster->ctas.size())
        emu_fail("mapa: block %u of a cluster of %zu", cta, emu_cta->cluster->ctas.size());
    emu_arrive(emu_cta->cluster->ctas[cta], bar);
}""",
    "cluster_ctarank": r"""inline uint32_t cluster_ctarank() { return emu_cta->rank; }""",
    "cluster_nctarank": r"""inline uint32_t cluster_nctarank()
{
    return static_cast<uint32_t>(emu_cta->cluster->ctas.size());
}""",
    "cluster_sync": r"""inline void cluster_sync()
{
    emu_bar(emu_cta->cluster->bar, static_cast<int>(emu_cta->cluster->ctas.size() * emu_bdim.x),
            false, true, "barrier.cluster", 0);
}""",
    "tma_load": r"""inline void tma_load(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                     int c2, bool batched)
{
    emu_queue(emu_cta, dst, emu_map(map, batched), bar, c0, c1, c2);
}""",
    "tma_load_multicast": r"""inline void tma_load_multicast(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                               int c0, int c1, int c2, bool batched, uint16_t mask)
{
    const EmuMap& m = emu_map(map, batched);
    for (size_t r = 0; r < emu_cta->cluster->ctas.size(); ++r)
        if (mask >> r & 1)
            emu_queue(emu_cta->cluster->ctas[r], dst, m, bar, c0, c1, c2);
    if (mask >> emu_cta->cluster->ctas.size())
        emu_fail("multicast to blocks beyond the cluster (mask %x)", mask);
}""",
    "tma_prefetch_map": r"""inline void tma_prefetch_map(const CUtensorMap*) {}""",
    "wgmma_fence": r"""inline void wgmma_fence() {}""",
    "wgmma_commit": r"""inline void wgmma_commit() { emu_close(emu_mma_groups, emu_mma_open); }""",
    "wgmma_wait": r"""template <int N>
inline void wgmma_wait() { emu_mma_wait(N); }""",
    "fence_acc": r"""inline void fence_acc(float (&)[ACC]) {}""",
    "keep_frags": r"""inline void keep_frags(const uint32_t (&)[M_WGMMAS][K_STEPS][4], bool, uint32_t) {}""",
    "wgmma_m64k16": r"""inline void wgmma_m64k16(float (&d)[ACC], uint64_t a, uint64_t b)
{
    emu_mma_issue(d, {BN}, 16, {TYPE}, true, {A_MN}, {B_MN}, a, b, nullptr);
}""",
    "wgmma_m64k8": r"""inline void wgmma_m64k8(float (&d)[ACC], uint64_t a, uint64_t b, int accumulate)
{
    emu_mma_issue(d, {BN}, 8, 2, accumulate != 0, false, false, a, b, nullptr);
}""",
    "wgmma_m64k8_rs": r"""inline void wgmma_m64k8_rs(float (&d)[ACC], const uint32_t (&a)[4], uint64_t b)
{
    emu_mma_issue(d, {MMA_N}, 8, 2, true, false, false, 0, b, a);
}""",
    "tf32_rna": r"""inline float tf32_rna(float x)  // cvt.rna.tf32.f32: to nearest, ties away
{
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7f800000u) != 0x7f800000u)
        u = (u + 0x1000u) & 0xffffe000u;
    return __uint_as_float(u);
}""",
    "lds128": r"""inline float4 lds128(uint32_t addr)
{
    float4 v;
    std::memcpy(&v, emu_aligned(addr, 16), 16);
    return v;
}""",
    "sts128": r"""inline void sts128(uint32_t addr, float4 v) { std::memcpy(emu_aligned(addr, 16), &v, 16); }""",
    "sts64": r"""inline void sts64(uint32_t addr, float x, float y)
{
    const float v[2] = {x, y};
    std::memcpy(emu_aligned(addr, 8), v, 8);
}""",
    "sts_pair": r"""inline void sts_pair(uint32_t addr, float x, float y)
{
    const auto h = pair_of(x, y);
    std::memcpy(emu_aligned(addr, 4), &h, 4);
}""",
    "stsm_x4": r"""inline void stsm_x4(uint32_t addr, const uint32_t (&x)[4])
{
    // matrix j's row i at lane 8 j + i's address; register j of lane 4 i + c holds its
    // columns 2 c, 2 c + 1
    EmuWarp& w = emu_warp();
    const int l = emu_tid.x % 32;
    std::memcpy(w.u[l], x, 16);
    w.u[l][4] = addr;
    w.bar.arrive_and_wait();
    uint32_t row[4];
    for (int c = 0; c < 4; ++c)
        row[c] = w.u[4 * (l % 8) + c][l / 8];
    std::memcpy(emu_aligned(addr, 16), row, 16);
    w.bar.arrive_and_wait();
}""",
    "fence_proxy_async": r"""inline void fence_proxy_async() {}""",
    "consumers_sync": r"""inline void consumers_sync() { emu_bar(emu_cta->named[1], NC, false, true, "bar.sync", 1); }""",
    "consumers_sync_or": r"""inline bool consumers_sync_or(bool flag)
{
    return emu_bar(emu_cta->named[1], NC, flag, true, "bar.red.or", 1);
}""",
    "turn_wait": r"""inline void turn_wait(int consumer, bool issued)
{
    if (consumer == 1)
        emu_bar(emu_cta->named[4], 256, false, true, "bar.sync", 4);
    else if (issued)
        emu_bar(emu_cta->named[5], 256, false, true, "bar.sync", 5);
}""",
    "turn_pass": r"""inline void turn_pass(int consumer, bool more)
{
    if (consumer == 0)
        emu_bar(emu_cta->named[4], 256, false, false, "bar.arrive", 4);
    else if (more)
        emu_bar(emu_cta->named[5], 256, false, false, "bar.arrive", 5);
}""",
    "warpgroup_sync": r"""inline void warpgroup_sync(int consumer)
{
    emu_bar(emu_cta->named[2 + consumer], 128, false, true, "bar.sync", 2 + consumer);
}""",
    "split_sync": r"""inline void split_sync() { emu_bar(emu_cta->named[6], NC, false, true, "bar.sync", 6); }""",
    "tma_store": r"""inline void tma_store(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, bool batched)
{
    emu_bulk_open.push_back({emu_map(map, batched), {c0, c1, c2}, src});
}""",
    "bulk_commit": r"""inline void bulk_commit() { emu_close(emu_bulk_groups, emu_bulk_open); }""",
    "bulk_wait_read": r"""template <int N>
inline void bulk_wait_read() { emu_bulk_retire(N); }""",
    "bulk_wait_all": r"""inline void bulk_wait_all() { emu_bulk_retire(0); }""",
    "dependent_launch_begin": r"""inline void dependent_launch_begin() {}""",
}

#: inline PTX the kernel body issues itself: nothing to emulate
_BODY_ASM = (r'asm volatile\("setmaxnreg\.[^"]*"\);', r'asm volatile\("fence\.mbarrier_init[^"]*"[^;]*;')

_HARNESS = r"""
// ---- the runner's launches, read from a script (tests/_wgmma_emulation.py) --------------
struct EmuVal {
    char kind;
    long long i;
    double f;
    void* p;
};
struct EmuPtr {
    void* p;
    template <class T> operator T*() const { return static_cast<T*>(p); }
};
static int emu_i32(const EmuVal& v) { return static_cast<int>(v.i); }
static long long emu_i64(const EmuVal& v) { return v.i; }
static float emu_f32(const EmuVal& v) { return static_cast<float>(v.f); }
static EmuPtr emu_ptr(const EmuVal& v) { return {v.p}; }

CALLS

struct EmuRegion {
    unsigned long long base, bytes;
    unsigned char* host;
    std::string path;
};
static std::vector<EmuRegion> emu_regions;

static void* emu_host(unsigned long long addr)  // a device address of the script, on the host
{
    if (addr == 0)
        return nullptr;
    for (const EmuRegion& r : emu_regions)
        if (addr >= r.base && addr <= r.base + r.bytes)
            return r.host + (addr - r.base);
    emu_fail("address 0x%llx is in no region", addr);
}

static void emu_run(int which, dim3 grid, dim3 block, int cx, unsigned smem, const std::vector<CUtensorMap>& maps,
                    const std::vector<EmuVal>& vals, std::mt19937& rng)
{
    emu_grid = grid;
    emu_bdim = block;
    if (grid.x % cx || block.x % 32)
        emu_fail("a grid of %u blocks in clusters of %d, blocks of %u threads", grid.x, cx, block.x);
    std::vector<dim3> origins;
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; x += cx)
                origins.push_back(dim3(x, y, z));
    std::shuffle(origins.begin(), origins.end(), rng);
    const uint32_t bytes = (std::max(smem, 1u) + 1023u) & ~1023u;
    for (const dim3& o : origins) {
        EmuCluster cl;
        std::vector<std::unique_ptr<EmuCta>> ctas;
        for (int r = 0; r < cx; ++r) {
            auto c = std::make_unique<EmuCta>();
            c->smem = static_cast<unsigned char*>(std::aligned_alloc(1024, bytes));
            std::memset(c->smem, 0xff, bytes);  // NaN: nothing was written
            c->smem_bytes = smem;
            ASAN_POISON_MEMORY_REGION(c->smem + smem, bytes - smem);
            c->rank = r;
            c->cluster = &cl;
            c->warps = std::make_unique<EmuWarp[]>(block.x / 32);
            cl.ctas.push_back(c.get());
            ctas.push_back(std::move(c));
        }
        emu_pool.run(cx * block.x, [&](int j) {
            const int r = j / block.x;
            const unsigned i = j % block.x;
            emu_rs_seq = 0;  // a fresh thread's
            emu_cta = cl.ctas[r];
            emu_tid = dim3(i, 0, 0);
            emu_bid = dim3(o.x + r, o.y, o.z);
            emu_call(which, maps.data(), vals.data());
            if (!emu_mma_open.empty() || !emu_mma_groups.empty())
                emu_fail("thread %u of block %u ends with wgmmas in flight", i, o.x + r);
            if (!emu_bulk_open.empty() || !emu_bulk_groups.empty())
                emu_fail("thread %u of block %u ends with TMA stores in flight", i, o.x + r);
        });
        for (auto& c : ctas) {
            ASAN_UNPOISON_MEMORY_REGION(c->smem + smem, bytes - smem);
            std::free(c->smem);
        }
    }
}

int main(int argc, char** argv)
{
    FILE* f = std::fopen(argv[1], "r");
    if (!f)
        emu_fail("cannot read %s", argv[1]);
    std::mt19937 rng(std::atoi(argv[2]));
    emu_eager = !std::strcmp(argv[3], "eager");
    std::vector<CUtensorMap> maps;
    char word[64];
    while (std::fscanf(f, "%63s", word) == 1) {
        if (!std::strcmp(word, "region")) {
            EmuRegion r;
            char path[4096];
            if (std::fscanf(f, "%llx %llu %4095s", &r.base, &r.bytes, path) != 3)
                emu_fail("a bad region line");
            r.path = path;
            const unsigned long long room = (r.bytes + 255) / 256 * 256 + 256;
            r.host = static_cast<unsigned char*>(std::aligned_alloc(256, room)) + r.base % 256;
            FILE* d = std::fopen(path, "rb");
            if (!d || std::fread(r.host, 1, r.bytes, d) != r.bytes)
                emu_fail("cannot read %llu bytes of %s", r.bytes, path);
            std::fclose(d);
            ASAN_POISON_MEMORY_REGION(r.host + r.bytes, room - r.base % 256 - r.bytes);
            emu_regions.push_back(r);
        } else if (!std::strcmp(word, "map")) {
            EmuMap m{};
            unsigned long long addr;
            if (std::fscanf(f, "%d %d %d %lld %lld %lld %lld %lld %d %d %d %d %llx", &m.es, &m.round_tf32,
                            &m.rank, &m.dim[0], &m.dim[1], &m.dim[2], &m.stride[0], &m.stride[1], &m.box[0],
                            &m.box[1], &m.box[2], &m.swizzle, &addr) != 13)
                emu_fail("a bad map line");
            m.addr = static_cast<unsigned char*>(emu_host(addr));
            CUtensorMap t{};
            std::memcpy(&t, &m, sizeof m);
            maps.push_back(t);
        } else if (!std::strcmp(word, "launch")) {
            int which, cx, n_maps, n_vals;
            unsigned gx, gy, gz, bx, smem;
            if (std::fscanf(f, "%d %u %u %u %u %d %u %d", &which, &gx, &gy, &gz, &bx, &cx, &smem, &n_maps) != 8)
                emu_fail("a bad launch line");
            std::vector<CUtensorMap> lm(n_maps);
            for (int i = 0; i < n_maps; ++i) {
                int id;
                if (std::fscanf(f, "%d", &id) != 1)
                    emu_fail("a bad launch line");
                lm[i] = maps.at(id);
            }
            if (std::fscanf(f, "%d", &n_vals) != 1)
                emu_fail("a bad launch line");
            std::vector<EmuVal> vals(n_vals);
            for (EmuVal& v : vals) {
                char tok[64];
                if (std::fscanf(f, "%63s", tok) != 1)
                    emu_fail("a bad value");
                v.kind = tok[0];
                if (v.kind == 'f')
                    v.f = std::strtod(tok + 2, nullptr);
                else if (v.kind == 'p')
                    v.p = emu_host(std::strtoull(tok + 2, nullptr, 0));
                else
                    v.i = std::strtoll(tok + 2, nullptr, 0);
            }
            emu_run(which, dim3(gx, gy, gz), dim3(bx, 1, 1), cx, smem, lm, vals, rng);
        } else {
            emu_fail("unknown script word %s", word);
        }
    }
    for (const EmuRegion& r : emu_regions) {
        FILE* d = std::fopen(r.path.c_str(), "wb");
        std::fwrite(r.host, 1, r.bytes, d);
        std::fclose(d);
        const unsigned long long room = (r.bytes + 255) / 256 * 256 + 256;
        ASAN_UNPOISON_MEMORY_REGION(r.host + r.bytes, room - r.base % 256 - r.bytes);
        std::free(r.host - r.base % 256);
    }
    return 0;
}
"""

_CAST = {"i": "emu_i32", "L": "emu_i64", "f": "emu_f32", "P": "emu_ptr"}


def _helpers(cfg) -> dict:
    """_PTX with the config's values filled in."""
    tv = cfg.template_values()
    fill = dict(BN=tv["BN"], MMA_N=tv["MMA_N"], A_MN=str(bool(tv["A_MN"])).lower(),
                B_MN=str(bool(tv["B_MN"])).lower(),
                TYPE={"f16": 0, "bf16": 1}.get(tv["PTX_T"], 2))
    return {name: re.sub(r"\{(\w+)\}", lambda m: str(fill[m.group(1)]), body)
            for name, body in _PTX.items()}


def _calls(cfg, kernels: dict) -> str:
    """emu_call: kernel `which` (kernels: name -> (which, signature, maps)) with its maps and
    scalars, each cast as its signature's letter says."""
    cases = []
    for name, (which, signature, n_maps) in kernels.items():
        args = [f"maps[{i}]" for i in range(n_maps)]
        args += [f"{_CAST[ch]}(v[{i}])" for i, ch in enumerate(signature)]
        cases.append(f"    case {which}:\n        {name}({', '.join(args)});\n        return;")
    return ("static void emu_call(int which, const CUtensorMap* maps, const EmuVal* v)\n{\n"
            "    switch (which) {\n" + "\n".join(cases) + "\n    }\n"
            "    emu_fail(\"no kernel %d\", which);\n}")


def emulation_source(cfg, kernels: dict, src: str | None = None) -> str:
    """The rendered wgmma kernel (and its pre-pass), or `src` (its source as a library
    ships it), as a host program (see the module doc) that runs the launches of a script;
    `kernels`: name -> (which, signature, maps)."""
    src = render(cfg) if src is None else src
    table = _helpers(cfg)
    for name in table:
        if re.search(rf"__forceinline__ [\w:]+ {name}\(", src):
            src = _without(src, name, table)
    src, found = re.subn(r"extern __shared__ __align__\(\d+\) unsigned char (\w+)\[\];",
                         r"unsigned char* const \1 = emu_cta->smem;", src)
    assert found == 1, "one dynamic shared array"
    for pattern in _BODY_ASM:
        src = re.sub(pattern, ";", src)
    assert not re.search(r"\basm\b", re.sub(r"//.*", "", src)), "inline PTX left"
    return _SHIM + src + _HARNESS.replace("CALLS", _calls(cfg, kernels))


def kernels_of(cfg) -> dict:
    """name -> (which, signature, tensor maps) of the kernels cfg's runner launches."""
    from tuner.runtime.runners import TmaRunner

    sig = (TmaRunner.SPLIT_SIGNATURE if cfg.presplit else
           TmaRunner.SPLIT_K_SIGNATURE if cfg.has_workspace else TmaRunner.SIGNATURE)
    out = {cfg.name: (0, sig, 2 + bool(cfg.store))}
    if cfg.pre_pass:
        out[f"{cfg.name}_prep"] = (1, TmaRunner.PREP_SIGNATURE, 0)
    return out


def build(cfg, where: Path, source: str | None = None, name: str | None = None,
          extra=()) -> Path:
    """cfg's emulation (or `source`, an edited one) compiled by g++ into `where` as `name`
    (default: the kernel's), with `extra` flags: the executable."""
    name = name or cfg.name
    cpp, exe = where / f"{name}.cpp", where / name
    cpp.write_text(emulation_source(cfg, kernels_of(cfg)) if source is None else source)
    r = subprocess.run(CXX + list(extra) + [f"-I{cuda_include()}", str(cpp), "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    return exe


def build_all(configs, where: Path) -> dict:
    """{config: its executable}, two compiles at a time (a failure, not a skip, where g++
    or the CUDA headers are missing)."""
    import concurrent.futures as cf

    import pytest

    if cuda_include() is None:
        pytest.fail("the emulation needs g++ and the CUDA toolkit's headers")
    with cf.ThreadPoolExecutor(2) as pool:
        return dict(zip(configs, pool.map(lambda c: build(c, where), configs)))


# ---- the runner's launches, recorded ----------------------------------------------------
class _Memory:
    """Fake device memory: regions at made-up addresses, each a file the program reads and
    writes back."""

    def __init__(self, where: Path):
        self.where, self.regions, self.next = where, [], 0x10000000

    def add(self, name: str, data: np.ndarray, offset: int = 0) -> int:
        """A region holding `data` (bytes) at an address `offset` past a 256-byte boundary."""
        base = self.next + offset
        self.next += -(-(data.nbytes + offset + 1) // 0x100000) * 0x100000
        path = self.where / name
        np.ascontiguousarray(data).tofile(path)
        self.regions.append((base, data.nbytes, path))
        return base

    def scratch(self, nbytes: int, zero: bool) -> int:
        """What the runner's per-stream scratch hands out (NaN where not zeroed)."""
        fill = np.zeros(nbytes, np.uint8) if zero else np.full(nbytes, 0xFF, np.uint8)
        return self.add(f"scratch{len(self.regions)}", fill)

    def read(self, base: int, dtype) -> np.ndarray:
        b, _, path = next(r for r in self.regions if r[0] == base)
        return np.fromfile(path, dtype=dtype)


@contextlib.contextmanager
def _recording_driver(memory: _Memory, sms: int):
    """The driver and TMA as TmaRunner sees them, recording each launch (kernel, grid,
    block, cluster, shared bytes, tensor maps, parameter values) and each map's arguments;
    scratch from `memory`; a GPU of `sms` SMs."""
    import pytest

    from tuner.runtime import driver, tma

    launches, maps = [], {}

    class Map:
        def __init__(self, args):
            self.args, self.id = args, len(maps)
            maps[id(self)] = self

        def getPtr(self):  # noqa: N802 - CUtensorMap's method
            return id(self)

    class Image:
        def __init__(self, library, name, smem, dependent=False):
            self.name, self.smem, self.blocks = name, smem, {}

        def prepare(self, g):
            return self.name

        def params(self, signature):  # one block a signature, kept (the driver's do too)
            if signature not in self.blocks:
                self.blocks[signature] = driver.ParamBlock(signature)
            return self.blocks[signature]

        def launch(self, f, grid, block, stream, address, cluster=(1, 1, 1)):
            blk = driver._BLOCKS[int(address)]
            inner = getattr(blk, "blk", blk)
            used = [maps[int(blk.ptrs[i])] for i in range(getattr(blk, "n_maps", 0))]
            launches.append((self.name, tuple(grid), tuple(block), tuple(cluster), self.smem,
                             used, inner.signature, inner.fmt.unpack_from(inner.buf)))

        def launcher(self, grid, block, cluster):
            return types.SimpleNamespace(launch=lambda f, stream, address: self.launch(
                f, grid, block, stream, address, cluster))

    class Scratch:
        def get(self, g, stream, purpose, nbytes, zero=False, allocate_captured=None):
            return memory.scratch(nbytes, zero)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(driver, "load_cubin", lambda cubin, what: None)
        mp.setattr(driver, "KernelImage", Image)
        mp.setattr(driver, "scratch", lambda: Scratch())
        mp.setattr(tma, "encode", Map)
        yield types.SimpleNamespace(launches=launches, maps=maps,
                                    g=types.SimpleNamespace(index=0, arch=types.SimpleNamespace(
                                        sm_count=sms)))


_SWIZZLE = {"CU_TENSOR_MAP_SWIZZLE_NONE": 0, "CU_TENSOR_MAP_SWIZZLE_32B": 32,
            "CU_TENSOR_MAP_SWIZZLE_64B": 64, "CU_TENSOR_MAP_SWIZZLE_128B": 128}
_ES = {"CU_TENSOR_MAP_DATA_TYPE_FLOAT16": 2, "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16": 2,
       "CU_TENSOR_MAP_DATA_TYPE_TFLOAT32": 4, "CU_TENSOR_MAP_DATA_TYPE_FLOAT32": 4}


def _script(memory: _Memory, rec, kernels: dict) -> str:
    lines = [f"region {base:#x} {nbytes} {path}" for base, nbytes, path in memory.regions]
    ids = {}
    for launch in rec.launches:
        for m in launch[5]:
            if m.id in ids:
                continue
            ids[m.id] = len(ids)
            a = m.args
            dims = list(a["globalDim"]) + [1] * (3 - len(a["globalDim"]))
            strides = list(a["globalStrides"]) + [0] * (2 - len(a["globalStrides"]))
            box = list(a["boxDim"]) + [1] * (3 - len(a["boxDim"]))
            assert a["elementStrides"] == [1] * a["tensorRank"], "element strides of 1"
            assert a["interleave"] == "CU_TENSOR_MAP_INTERLEAVE_NONE"
            assert a["oobFill"] == "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE"  # zeros
            lines.append(" ".join(map(str, [
                "map", _ES[a["tensorDataType"]], int(a["tensorDataType"].endswith("TFLOAT32")),
                a["tensorRank"], *dims, *strides, *box, _SWIZZLE[a["swizzle"]],
                hex(a["globalAddress"])])))
    for name, grid, block, cluster, smem, used, signature, values in rec.launches:
        which = kernels[name][0]
        vals = [f"{ch.lower() if ch != 'L' else 'i'}:{v!r}" if ch != "P" else f"p:{v:#x}"
                for ch, v in zip(signature, values)]
        lines.append(" ".join(map(str, ["launch", which, *grid, block[0], cluster[0], smem,
                                        len(used), *(ids[m.id] for m in used), len(vals),
                                        *vals])))
    return "\n".join(lines) + "\n"


# ---- operands and the reference ---------------------------------------------------------
def _matrix(rng, batch, rows, cols, col_major, t, pad, shared=False, unaligned=False):
    """A batch x rows x cols operand stored row- or column-major, each stored row padded to
    a 16-byte multiple plus `pad` 16-byte units, problems a 16-byte multiple apart (TMA's
    rules), or (`unaligned`) each one element more: (stored values, float64 values, ld,
    stride; stride 0 where `shared`)."""
    es = 4 if t == "f32" else 2
    srows, scols = (cols, rows) if col_major else (rows, cols)
    ld = (-(-scols // (16 // es)) + pad) * (16 // es) + unaligned
    stride = 0 if shared else -(-(srows * ld + 5) // (16 // es)) * (16 // es) + unaligned
    return (*laid_out(rng, batch, rows, cols, col_major, t, ld, stride), ld, stride)


def run(exe: Path, cfg, shape, where: Path, batch=1, alpha=1.0, beta=0.0, shared_b=False,
        sms=3, seed=0, pads=(0, 0, 0), land="lazy", unaligned=False, order=None,
        raw=None) -> tuple[float, bool]:
    """cfg's kernel on fresh operands, launched as its runner launches it on a GPU of `sms`
    SMs, C poisoned with NaN, TMA's loads landing `land` ("lazy" or "eager", the module
    doc); `unaligned`: A and B each one element past a 16-byte boundary, their leading
    dimensions and strides odd (a pre-pass's operands); `order`: the seed of the blocks'
    order (default `seed`, the operands'); `raw`: a list C's bits are appended to:
    (relative error against the float64 reference of the inputs as stored (tf32 data:
    rounded to tf32), the elements past N in each row untouched?)."""
    from tuner.runtime.runners import TmaRunner

    m, n, k = shape
    rng = np.random.default_rng(seed)
    t = "f32" if cfg.dtype.short in ("tf32", "f32") else cfg.dtype.short
    out = cfg.out.short
    a, av, lda, sa = _matrix(rng, batch, m, k, cfg.layout in (Layout.TN, Layout.TT), t, pads[0],
                             unaligned=unaligned)
    b, bv, ldb, sb = _matrix(rng, batch, k, n, cfg.layout in (Layout.NT, Layout.TT), t, pads[1],
                             shared_b, unaligned)
    ces = 4 if out == "f32" else 2
    ldc = -(-n // (16 // ces)) * (16 // ces) + pads[2] * (16 // ces)
    sc = m * ldc + 16 // ces if batch > 1 else 0
    c0 = _rounded(rng.standard_normal((batch, m, n)), out)
    cflat = np.full(max(sc * (batch - 1), 0) + m * ldc, np.nan)
    for i in range(batch):
        for r in range(m):
            cflat[i * sc + r * ldc: i * sc + r * ldc + n] = c0[i, r] if beta else np.nan
    bias_t = "f32" if cfg.bias == "f32" else out
    bias = _rounded(rng.standard_normal(n if cfg.bias != "none" else 0), bias_t)
    memory = _Memory(where)
    skew = a.itemsize if unaligned else 0
    pa, pb = memory.add("a", a, skew), memory.add("b", b, skew)
    pc = memory.add("c", _stored(cflat, out))
    pbias = memory.add("bias", _stored(bias, bias_t)) if len(bias) else 0
    kernels = kernels_of(cfg)
    with _recording_driver(memory, sms) as rec:
        runner = TmaRunner(cfg, b"")
        launch = runner.bind(rec.g, m, n, k, lda, ldb, ldc, batch=batch,
                             strides=(sa, sb, sc))
        launch(pa, pb, pc, alpha, beta, 0, bias=pbias)
        script = _script(memory, rec, kernels)
    (where / "script").write_text(script)
    r = subprocess.run([str(exe), str(where / "script"), str(seed if order is None else order),
                        land], capture_output=True,
                       text=True, timeout=600, preexec_fn=one_cpu())
    assert r.returncode == 0, r.stderr[-3000:]
    bits = memory.read(pc, np.float32 if out == "f32" else np.uint16)
    if raw is not None:
        raw.append(bits)
    if cfg.dtype.short == "tf32":  # the reference of tf32's inputs: rounded to tf32
        av, bv = _tf32(av), _tf32(bv)
    return compared(bits, out, av, bv, c0, bias, alpha, beta, cfg.act, ldc, sc)


def _tf32(x: np.ndarray) -> np.ndarray:
    """float64 values of fp32 data rounded to tf32 (to nearest; the reference of tf32)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x1000) & 0xFFFFE000).astype(np.uint32)
    return u.view(np.float32).astype(np.float64)
