/* OpenMPI's blocking all-reduce against its non-blocking forms, 2+ ranks, no
 * dtrain involved: the measurement behind the handshake default on one host
 * (docs/communicator.md, "Waiting"; Note [waiting without spinning]).
 *
 *   mpicc -O2 bench/mpi/allreduce_forms.c -o /tmp/allreduce_forms
 *   mpirun --allow-run-as-root --oversubscribe -np 2 /tmp/allreduce_forms
 *
 * For each size: MPI_Allreduce; MPI_Iallreduce completed by an MPI_Test loop;
 * MPI_Ireduce_scatter_block then MPI_Iallgather, each completed the same way.
 * Best of 5 rounds, the slowest rank's mean time per call. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static void complete(MPI_Request* request) {
  int done = 0;
  while (!done) MPI_Test(request, &done, MPI_STATUS_IGNORE);
}

static double time_form(int form, float* data, float* shard, int count, int iterations) {
  int size;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  for (int i = 0; i < iterations; ++i) {
    MPI_Request request;
    if (form == 0) {
      MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (form == 1) {
      MPI_Iallreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &request);
      complete(&request);
    } else {
      MPI_Ireduce_scatter_block(data, shard, count / size, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &request);
      complete(&request);
      MPI_Iallgather(shard, count / size, MPI_FLOAT, data, count / size, MPI_FLOAT, MPI_COMM_WORLD, &request);
      complete(&request);
    }
  }
  double mine = (MPI_Wtime() - start) / iterations, slowest;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

int main(int argc, char** argv) {
  int provided, rank;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (long bytes = 65536; bytes <= (64L << 20); bytes *= 4) {
    const int count = (int)(bytes / 4);
    float* data = calloc(count, sizeof(float));
    float* shard = calloc(count, sizeof(float));
    int iterations = (int)((128L << 20) / bytes);
    if (iterations > 2000) iterations = 2000;
    if (iterations < 3) iterations = 3;
    double best[3] = {1e9, 1e9, 1e9};
    for (int round = 0; round < 5; ++round)
      for (int form = 0; form < 3; ++form) {
        const double t = time_form(form, data, shard, count, iterations);
        if (t < best[form]) best[form] = t;
      }
    if (rank == 0)
      printf("%9ld B  MPI_Allreduce %8.1f us  MPI_Iallreduce %8.1f us (%.2fx as long)  "
             "Ireduce_scatter+Iallgather %8.1f us (%.2fx)\n",
             bytes, best[0] * 1e6, best[1] * 1e6, best[1] / best[0], best[2] * 1e6, best[2] / best[0]);
    free(data);
    free(shard);
  }
  MPI_Finalize();
  return 0;
}
