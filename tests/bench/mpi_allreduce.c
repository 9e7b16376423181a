/* An OSU-style MPI_Allreduce timing (float32 sum), the reference for rdmacc's
 * shared-memory transport: tools/benchmark-shm runs it under Open MPI with
 * the vader shared-memory BTL next to rdmacc-perf, alternated.
 *
 *   mpirun -n 4 --mca btl self,vader mpi-allreduce BYTES ITERATIONS WARMUP
 *
 * Prints one line: "bytes time_us busbw_gbs", with the time per iteration
 * averaged over the ranks (as rdmacc-perf does) and busbw = bytes / time x
 * 2(n-1)/n (nccl-tests' definition). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc != 4) {
    if (rank == 0) fprintf(stderr, "usage: mpi-allreduce BYTES ITERATIONS WARMUP\n");
    MPI_Finalize();
    return 2;
  }
  const long bytes = atol(argv[1]);
  const int iterations = atoi(argv[2]), warmup = atoi(argv[3]);
  const int count = (int)(bytes / (long)sizeof(float));
  float* in = malloc((size_t)count * sizeof(float) + 1);
  float* out = malloc((size_t)count * sizeof(float) + 1);
  for (int i = 0; i < count; ++i) in[i] = 1.0f;
  for (int i = 0; i < warmup; ++i) MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  double start = MPI_Wtime();
  for (int i = 0; i < iterations; ++i) {
    MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  double mine = (MPI_Wtime() - start) / iterations, sum = 0;
  MPI_Reduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  int wrong = count > 0 && out[count - 1] != (float)size;
  int anyWrong = 0;
  MPI_Reduce(&wrong, &anyWrong, 1, MPI_INT, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    double us = sum / size * 1e6;
    double busbw = (double)bytes / (us * 1e3) * 2.0 * (size - 1) / size;
    printf("%ld %.3f %.6f%s\n", bytes, us, busbw, anyWrong ? " WRONG" : "");
  }
  free(in);
  free(out);
  MPI_Finalize();
  return anyWrong;
}
