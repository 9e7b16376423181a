/* Open MPI's own start-up under its own launcher, the reference for
 * rdmacc's PMIx bootstrap: tools/benchmark-formation --launcher mpirun
 * runs it next to rdmacc-perf's formation, alternated.
 *
 *   mpirun -n 64 --mca pml ob1 --mca btl self,vader mpi-init
 *
 * Each rank times, from main to the end of a first 8-byte MPI_Allreduce,
 * what rdmacc-perf times from its first line to a formed group:
 * MPI_Init (PMIx_Init, the modex fence) and the connections the first
 * collective makes. Prints one line: "slowest_ms fastest_ms" (the largest
 * and smallest rank's), as rdmacc-perf's formation. */
#include <mpi.h>
#include <stdio.h>
#include <time.h>

static double nowMs(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

int main(int argc, char** argv) {
  const double start = nowMs();
  MPI_Init(&argc, &argv);
  float in[2] = {1.0f, 1.0f}, out[2] = {0, 0};
  MPI_Allreduce(in, out, 2, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const double mine = nowMs() - start;
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  double slowest = 0, fastest = 0;
  MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  MPI_Reduce(&mine, &fastest, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
  const int wrong = out[1] != (float)size;
  if (rank == 0) printf("%.3f %.3f%s\n", slowest, fastest, wrong ? " WRONG" : "");
  MPI_Finalize();
  return wrong;
}
