/* Pins each thread of torch's OpenMP team to one core (thread i to cpus[i]), as vLLM's CPU
 * backend does: two threads that meet at a barrier hundreds of times a step lose less when
 * neither migrates. Built with -fopenmp, so the team is torch's own (see engine/native).
 * Returns 0, or the errno of the first sched_setaffinity that failed. */
#define _GNU_SOURCE
#include <errno.h>
#include <omp.h>
#include <sched.h>
#include <stdint.h>

int bind_threads(const int32_t *cpus, int64_t n) {
    int failed = 0;
#pragma omp parallel num_threads(n)
    {
        const int t = omp_get_thread_num();
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpus[t], &set);
        if (sched_setaffinity(0, sizeof(set), &set) != 0) {
#pragma omp atomic write
            failed = errno;
        }
    }
    return failed;
}
