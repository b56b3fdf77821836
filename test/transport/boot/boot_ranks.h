/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Ranks of a bootstrap for the tests of transport/boot/: threads of the test process meeting
 * on loopback with ports the kernel picks (so that tests may run in parallel), each doing some
 * work once joined and reporting its status, message and time.
 */
#ifndef RS_TEST_BOOT_RANKS_H
#define RS_TEST_BOOT_RANKS_H

#include "base/error.h"
#include "base/log.h"
#include "transport/boot/bootstrap.h"

#include <pthread.h>
#include <semaphore.h>
#include <stddef.h>
#include <stdint.h>

#define SECRET "test-secret"

/* What one rank does after boot_init. */
enum work { WORK_NONE, WORK_COLLECTIVES, WORK_ALLGATHER, WORK_ABORT, WORK_LEAVE };

struct rank_run {
    struct boot_id id;
    int rank, size, timeout_ms;
    enum work work;
    size_t bytes; /* WORK_ALLGATHER: slot size */
    sem_t *done;  /* posted when the rank returns, if set */
    reshard_status_t st;
    char msg[RS_ERROR_MAX];
    int64_t ms;      /* time the failing (or last) call took */
    int64_t init_ms; /* time boot_init took */
    int data_ok;     /* the collectives produced the expected bytes */
    struct boot *b;  /* left open for the test to look at */
    pthread_t thread;
};

int64_t now_ms(void);
/* A port of the kernel's pick that nobody listens on, held until the process ends (bound on
 * every address, not listening, SO_REUSEADDR: a bootstrap may listen there too); -1 if none.
 * Tests reach it at the loopback address. */
int held_port(int family);
/* The same at a given port (0: the kernel's pick); -1 when it cannot be held. */
int hold_port(int family, int port);
int held_loopback_port(void); /* held_port(AF_INET), asserted */
/* Moves this thread, and the threads and processes it starts from then on, into a network
 * namespace of its own (as root, or through a user namespace) with loopback up, where no other
 * program can bind a port; 0, or -1 with errno when none can be made. Once per process. */
int private_net(void);
/* held_loopback_port in a namespace of our own (private_net) where one can be made: there a
 * program that binds the same port number with SO_REUSEADDR (a bootstrap's rank 0 of another
 * job, torch's store, a launcher that picked the port and released it) cannot listen on it
 * before rank 0 does. Where none can be made it says so and shares the host's ports. */
int private_loopback_port(void);
/* The tunables the bootstrap reads, back to their defaults whatever the test's environment. */
void clear_boot_params(void);
void loopback_id(int port, const char *secret, struct boot_id *id);
/* An id listening on 127.0.0.1 at a port of the kernel's pick (bound, then read back), with a
 * random secret, for rank 0 of this process or its children (boot_id_create). */
void listening_id(struct boot_id *id);
/* The same place as id (127.0.0.1, its port) with a secret from another string. */
void same_place_id(const struct boot_id *id, const char *secret, struct boot_id *out);
unsigned char pattern(int rank, size_t i);
/* allgather, a bcast from every root, an allreduce and a barrier, each checked. */
int collectives(struct rank_run *r);
int allgather_slots(struct rank_run *r);
void do_work(struct rank_run *r);
void *rank_main(void *arg);
void prep(struct rank_run *r, const struct boot_id *id, int rank, int size, int timeout_ms,
          enum work work);
void launch(struct rank_run *r);
void start(struct rank_run *r, const struct boot_id *id, int rank, int size, int timeout_ms,
           enum work work);
/* A thread's body: do_work on r's open bootstrap, its message kept. */
void *work_main(void *arg);
/* Every rank of r (already joined) runs `work` on its open bootstrap, in its own thread. */
void work_all(struct rank_run *r, int n, enum work work);
void finish(struct rank_run *r);
void finish_all(struct rank_run *r, int n);
void close_all(struct rank_run *r, int n);
void assert_all_ok(struct rank_run *r, int n);
/* n ranks of id run the collectives together; every one must succeed with the right data. */
void run_job_ok(const struct boot_id *id, int n);

/* Every warning logged once capture_warning is base/log's sink, one a line. */
extern char warned[4 * RS_ERROR_MAX];
void capture_warning(enum rs_log_level level, unsigned long flags, const char *msg);
/* A plain TCP connection to where id's rank 0 listens (127.0.0.1 here). */
int raw_connect(const struct boot_id *id);

/* ---- launcher environment ---- */

void clear_launcher_env(void);
/* torchrun's variables for rank 3 of 8 at 127.0.0.1:29400. */
void set_torchrun(const char *run_id);

#endif
