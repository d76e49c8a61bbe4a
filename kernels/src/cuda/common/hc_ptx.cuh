// PTX wrappers of the fast decode path's kernels: programmatic dependent launch and cluster barriers
// (sm_90), cp.async, ldmatrix and mma.sync (sm_80), and the global timer (timeline probe builds); the
// general path's norm kernel takes its cp.async from here too.
// Each compiles to nothing or traps where the architecture lacks it, as its comment says.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace hcfuse {
namespace ptx {

__device__ __forceinline__ void WaitOnProducer() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void ReleaseDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Every thread of every CTA of the cluster calls these in the same order (a split cluster barrier).
// ClusterArriveRelaxed + ClusterWait at the start: all peers are running before any DSMEM access.
__device__ __forceinline__ void ClusterArriveRelaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void ClusterArrive() {  // release: this thread's DSMEM stores are visible after the wait
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void ClusterWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void ClusterSync() {
  ClusterArrive();
  ClusterWait();
}

__device__ __forceinline__ int ClusterRank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return static_cast<int>(cooperative_groups::this_cluster().block_rank());
#else
  return 0;
#endif
}

// The address of `p` (this CTA's shared memory) in the shared memory of cluster rank `rank`.
template <typename P>
__device__ __forceinline__ P* PeerShared(P* p, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().map_shared_rank(p, rank);
#else
  __trap();
  return p;
#endif
}

__device__ __forceinline__ unsigned SharedAddress(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

template <int BYTES>
__device__ __forceinline__ void CpAsync(void* smem, const void* gmem) {
  if constexpr (BYTES == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(SharedAddress(smem)), "l"(gmem) : "memory");
  } else if constexpr (BYTES == 8) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(SharedAddress(smem)), "l"(gmem) : "memory");
  } else {
    static_assert(BYTES == 4, "cp.async copies 4, 8 or 16 bytes");
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(SharedAddress(smem)), "l"(gmem) : "memory");
  }
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void CpAsyncWaitAll() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// A fragment of a 16 x 16 tile of row-major A (row stride lda elements) at column k0.
// lane_row: the shared-memory address (SharedAddress) of this lane's row.
__device__ __forceinline__ void LoadAFragment(unsigned (&a)[4], unsigned lane_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(lane_row)
               : "memory");
}

// B fragment of a 16 x 8 tile of row-major B ([k][n], used in place) through the transposing load.
__device__ __forceinline__ void LoadBFragment(unsigned (&b)[2], unsigned lane_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
               : "=r"(b[0]), "=r"(b[1])
               : "r"(lane_row)
               : "memory");
}

// A fragment of a 16 x 16 tile of A = W^T, W row-major [k][m] used in place, through the transposing load
// (rows on the N side: the weights are mma's A operand).
__device__ __forceinline__ void LoadAFragmentTrans(unsigned (&a)[4], unsigned lane_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(lane_row)
               : "memory");
}

// d += a @ b on tensor cores, fp32 accumulation.
template <typename T>
__device__ __forceinline__ void Mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    static_assert(std::is_same_v<T, __half>, "the fast path runs float16 and bfloat16");
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}
// ---- Bulk copies (sm_90): global -> this CTA's shared memory by the copy engine, completing on an
// mbarrier (expected bytes set by one arrival). The barrier is used for one phase per kernel.
__device__ __forceinline__ void MbarrierInit(unsigned long long* bar, unsigned count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SharedAddress(bar)), "r"(count) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // visible to the copy engine and the peers
#else
  __trap();
#endif
}

__device__ __forceinline__ void MbarrierExpectBytes(unsigned long long* bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SharedAddress(bar)), "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}

// One plain arrival on this CTA's barrier (release at CTA scope).
__device__ __forceinline__ void MbarrierArrive(unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(SharedAddress(bar)) : "memory");
#else
  __trap();
#endif
}

// bytes (a multiple of 16; both addresses 16-byte aligned) from gmem to smem, counted on bar.
__device__ __forceinline__ void BulkCopy(void* smem, const void* gmem, unsigned bytes, unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   SharedAddress(smem)),
               "l"(gmem), "r"(bytes), "r"(SharedAddress(bar))
               : "memory");
#else
  __trap();
#endif
}

// Blocks until phase `parity` of bar completed (every expected byte arrived). kClusterScope: acquire at
// cluster scope, so that what peers pushed with st.async counted on bar is visible after it.
template <bool kClusterScope = false>
__device__ __forceinline__ void MbarrierWait(unsigned long long* bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned done = 0;
  do {
    if constexpr (kClusterScope) {
      asm volatile(
          "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
          : "=r"(done)
          : "r"(SharedAddress(bar)), "r"(parity)
          : "memory");
    } else {
      asm volatile(
          "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
          : "=r"(done)
          : "r"(SharedAddress(bar)), "r"(parity)
          : "memory");
    }
  } while (!done);
#else
  __trap();
#endif
}

// ---- Pushes into a peer CTA's shared memory that complete on the peer's mbarrier (sm_90): no cluster
// barrier, so no GPU-scope MEMBAR waiting for this thread's other stores. The receiver's thread 0
// declares the bytes of a phase (MbarrierExpectBytesCluster), every receiving thread waits for the
// phase (MbarrierWait<true>); the senders' st.async count their bytes on it.

// The shared::cluster address of this CTA's shared-memory address `local` (SharedAddress) in rank `rank`.
__device__ __forceinline__ unsigned PeerSharedAddress(unsigned local, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
#else
  __trap();
  return local;
#endif
}

// 16 bytes to `remote` (PeerSharedAddress, 16-byte aligned), counted on the mbarrier at `remote_bar`.
__device__ __forceinline__ void StoreAsyncToPeer(unsigned remote, const uint4& v, unsigned remote_bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                   remote),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(remote_bar)
               : "memory");
#else
  __trap();
#endif
}

// One arrival on this CTA's barrier that expects `bytes` more (relaxed: it publishes no data of its own).
__device__ __forceinline__ void MbarrierExpectBytesCluster(unsigned long long* bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.relaxed.cluster.shared::cta.b64 _, [%0], %1;" ::"r"(SharedAddress(bar)),
               "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}

// Nanoseconds of the GPU's global timer (coarse ticks; for the timeline probe only).
__device__ __forceinline__ unsigned long long GlobalTimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The SM this thread runs on (for the timeline probe only).
__device__ __forceinline__ unsigned SmId() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

}  // namespace ptx
}  // namespace hcfuse
