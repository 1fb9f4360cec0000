/* Blocks for known times, each kind under its own function, and prints how
 * long each kind's calls took (ms, measured around the calls):
 *   sleeper_fn      nanosleep
 *   pipe_reader_fn  read() on a pipe that thread pipe_writer fills after a sleep
 *   cond_waiter_fn  pthread_cond_wait until thread cond_signal signals
 *   mutex_waiter_fn pthread_mutex_lock of a mutex thread mutex_holder holds
 * usage: offcpu [-|MS] [ROUNDS] [MS_PER_BLOCK]
 * A short warm_up phase comes first (a few 1 ms sleeps). */
#define _GNU_SOURCE
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "wait_start.h"

static int rounds = 5, block_ms = 40;
static double t_sleep, t_pipe, t_cond, t_mutex;
static int pipefd[2];
static pthread_mutex_t cv_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int ready;		/* signals not yet taken: none is lost under load */
static pthread_mutex_t held = PTHREAD_MUTEX_INITIALIZER;
static sem_t holding, taken;

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

__attribute__((noinline)) void warm_up(void)
{
	for (int i = 0; i < 5; i++)
		sleep_ms(1);
}

__attribute__((noinline)) void sleeper_fn(void)
{
	struct timespec ts = { block_ms / 1000, (block_ms % 1000) * 1000000L };
	double t0 = now_ms();
	nanosleep(&ts, NULL);
	t_sleep += now_ms() - t0;
}

__attribute__((noinline)) void pipe_writer_fn(void)
{
	if (write(pipefd[1], "x", 1) != 1)
		exit(3);
}

static void *pipe_writer(void *arg)
{
	pthread_setname_np(pthread_self(), "pipe_writer");
	for (int i = 0; i < rounds; i++) {
		sleep_ms(block_ms);
		pipe_writer_fn();
	}
	return arg;
}

__attribute__((noinline)) void pipe_reader_fn(void)
{
	char c;
	double t0 = now_ms();
	if (read(pipefd[0], &c, 1) != 1)
		exit(3);
	t_pipe += now_ms() - t0;
}

__attribute__((noinline)) void cond_signal_fn(void)
{
	pthread_mutex_lock(&cv_lock);
	ready++;
	pthread_cond_signal(&cv);
	pthread_mutex_unlock(&cv_lock);
}

static void *cond_signaller(void *arg)
{
	pthread_setname_np(pthread_self(), "cond_signal");
	for (int i = 0; i < rounds; i++) {
		sleep_ms(block_ms);
		cond_signal_fn();
	}
	return arg;
}

__attribute__((noinline)) void cond_waiter_fn(void)
{
	pthread_mutex_lock(&cv_lock);
	double t0 = now_ms();
	while (!ready)
		pthread_cond_wait(&cv, &cv_lock);
	t_cond += now_ms() - t0;
	ready--;
	pthread_mutex_unlock(&cv_lock);
}

static void *mutex_holder(void *arg)
{
	pthread_setname_np(pthread_self(), "mutex_holder");
	for (int i = 0; i < rounds; i++) {
		pthread_mutex_lock(&held);
		sem_post(&holding);
		sleep_ms(block_ms);
		pthread_mutex_unlock(&held);
		sem_wait(&taken);
	}
	return arg;
}

__attribute__((noinline)) void mutex_waiter_fn(void)
{
	double t0 = now_ms();
	pthread_mutex_lock(&held);
	t_mutex += now_ms() - t0;
	pthread_mutex_unlock(&held);
}

int main(int argc, char **argv)
{
	pthread_t t;
	if (wait_start(argc > 1 ? argv[1] : NULL))
		return 4;
	if (argc > 2)
		rounds = atoi(argv[2]);
	if (argc > 3)
		block_ms = atoi(argv[3]);
	warm_up();
	for (int i = 0; i < rounds; i++)
		sleeper_fn();

	if (pipe(pipefd))
		return 2;
	pthread_create(&t, NULL, pipe_writer, NULL);
	for (int i = 0; i < rounds; i++)
		pipe_reader_fn();
	pthread_join(t, NULL);

	pthread_create(&t, NULL, cond_signaller, NULL);
	for (int i = 0; i < rounds; i++)
		cond_waiter_fn();
	pthread_join(t, NULL);

	sem_init(&holding, 0, 0);
	sem_init(&taken, 0, 0);
	pthread_create(&t, NULL, mutex_holder, NULL);
	for (int i = 0; i < rounds; i++) {
		sem_wait(&holding);
		mutex_waiter_fn();
		sem_post(&taken);
	}
	pthread_join(t, NULL);

	printf("sleep %.3f\npipe %.3f\ncond %.3f\nmutex %.3f\n", t_sleep, t_pipe,
	       t_cond, t_mutex);
	return 0;
}
