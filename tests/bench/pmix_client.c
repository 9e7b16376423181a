/* A bare PMIx client under the same launcher, the floor of rdmacc's PMIx
 * bootstrap: tools/benchmark-formation --launcher mpirun runs it next to
 * rdmacc-perf's formation and Open MPI's start-up, alternated.
 *
 *   mpirun -n 64 pmix-client
 *
 * Each rank times, from main, what rdmacc's PMIx path needs before its own
 * work: PMIx_Init, a put of one record of rdmacc's host record's size, one
 * fence that collects every record, and a get of each peer's. Rank 0
 * prints "slowest_ms fastest_ms" (the largest and smallest rank's), as
 * rdmacc-perf's formation; the times travel through a second fence. */
#include <pmix.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static double nowMs(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int put(const char* key, void* bytes, size_t size) {
  pmix_value_t v;
  memset(&v, 0, sizeof v);
  v.type = PMIX_BYTE_OBJECT;
  v.data.bo.bytes = bytes;
  v.data.bo.size = size;
  return PMIx_Put(PMIX_GLOBAL, key, &v) == PMIX_SUCCESS && PMIx_Commit() == PMIX_SUCCESS;
}

static int fence(void) {
  pmix_info_t info;
  bool collect = true;
  PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
  return PMIx_Fence(NULL, 0, &info, 1) == PMIX_SUCCESS;
}

/* Rank `rank`'s value of `key` into `out` (at most `size` bytes). */
static int get(const pmix_proc_t* self, pmix_rank_t rank, const char* key, void* out,
               size_t size) {
  pmix_proc_t peer;
  PMIX_LOAD_PROCID(&peer, self->nspace, rank);
  pmix_value_t* v = NULL;
  if (PMIx_Get(&peer, key, NULL, 0, &v) != PMIX_SUCCESS || v == NULL) return 0;
  const int ok = v->type == PMIX_BYTE_OBJECT && v->data.bo.size <= size;
  if (ok) memcpy(out, v->data.bo.bytes, v->data.bo.size);
  PMIX_VALUE_RELEASE(v);
  return ok;
}

int main(void) {
  const double start = nowMs();
  pmix_proc_t self;
  if (PMIx_Init(&self, NULL, 0) != PMIX_SUCCESS) return 1;
  pmix_proc_t job;
  PMIX_LOAD_PROCID(&job, self.nspace, PMIX_RANK_WILDCARD);
  pmix_value_t* v = NULL;
  if (PMIx_Get(&job, PMIX_JOB_SIZE, NULL, 0, &v) != PMIX_SUCCESS || v == NULL) return 1;
  const pmix_rank_t size = v->data.uint32;
  PMIX_VALUE_RELEASE(v);
  char record[512], got[512];
  memset(record, 'r', sizeof record);
  if (!put("record", record, sizeof record) || !fence()) return 1;
  for (pmix_rank_t r = 0; r < size; ++r) {
    if (r != self.rank && !get(&self, r, "record", got, sizeof got)) return 1;
  }
  double mine = nowMs() - start;
  if (!put("ms", &mine, sizeof mine) || !fence()) return 1;
  if (self.rank == 0) {
    double slowest = mine, fastest = mine, theirs = 0;
    for (pmix_rank_t r = 1; r < size; ++r) {
      if (!get(&self, r, "ms", &theirs, sizeof theirs)) return 1;
      slowest = theirs > slowest ? theirs : slowest;
      fastest = theirs < fastest ? theirs : fastest;
    }
    printf("%.3f %.3f\n", slowest, fastest);
  }
  return PMIx_Finalize(NULL, 0) == PMIX_SUCCESS ? 0 : 1;
}
