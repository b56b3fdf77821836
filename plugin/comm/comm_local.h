/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Local peers are verified, not believed. A rank writes another's host memory (cross-memory
 * attach) only after the kernel has named that process: over a Unix socket between the two
 * (SO_PEERCRED), in the same network and PID namespaces, proving with the random token of its
 * hello that it is the job's rank it claims, and letting this rank write it under the ptrace
 * rules (transport/cma.h). Hostnames and domains say which ranks to try, never which to trust.
 */
#ifndef RS_COMM_LOCAL_H
#define RS_COMM_LOCAL_H

#include "comm.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define COMM_LOCAL_TOKEN 16

/* What a rank claims in its communicator hello for the local path. */
struct comm_local_hello {
    int32_t pid;                           /* its process, as it says */
    unsigned char token[COMM_LOCAL_TOKEN]; /* random, drawn per rank and communicator */
};

/* What this rank concluded about a rank of its domain (why it may write it, or not). */
enum comm_local_verdict {
    COMM_LOCAL_NOT_PEER = 0, /* this rank, an absent one, or one of another domain */
    COMM_LOCAL_WRITABLE,     /* verified, and it lets this rank write it */
    COMM_LOCAL_NOT_HERE,     /* nobody listens on its socket name here: another host or netns */
    COMM_LOCAL_IMPOSTOR,     /* its socket is held by another process than the one announced */
    COMM_LOCAL_OTHER_USER,   /* the process runs as another user */
    COMM_LOCAL_OTHER_NS,     /* in another network or PID namespace */
    COMM_LOCAL_BAD_PROOF,    /* its answer did not carry the token of its hello */
    COMM_LOCAL_CLOSED,  /* it closed without answering: it did not take this rank for its peer */
    COMM_LOCAL_SILENT,  /* no answer before RESHARD_TIMEOUT */
    COMM_LOCAL_BUSY,    /* its socket's queue stayed full until RESHARD_TIMEOUT */
    COMM_LOCAL_REFUSED, /* verified, but its kernel does not let this rank write it */
    COMM_LOCAL_FAILED,  /* a socket call of this rank's failed */
};

/* Before the hello: draws this rank's token, fills *mine and opens the rank's local socket
 * (a name made of its uid, pid and spare id, so that it exists before anyone learns it). A
 * socket that cannot be opened costs only the local path (one WARN); fails when out of memory
 * or without randomness. */
reshard_status_t comm_local_open(struct reshard_comm *c, struct comm_local_hello *mine);
/* After the hello, with the topology made: rank r's claims at (char *)first + r * stride.
 * Verifies the ranks of this rank's domain, answers theirs, and leaves c->pid[q] the
 * verified pid of each peer this rank may write (0 for every other), its own pid for itself.
 * Every wait ends at RESHARD_TIMEOUT; a peer that fails costs only its local path, said once
 * in the log. Fails only when out of memory. Closes the local socket. */
reshard_status_t comm_local_verify(struct reshard_comm *c, const struct comm_local_hello *first,
                                   size_t stride);
/* A growth's member (c grown from old, old formed): instead of comm_local_open, keeps what old
 * concluded about its members (verdicts, pids, handles on their processes: comm_local_verify
 * verifies only the joiners of its domain then) and old's token, and opens its local socket
 * under c's spare id, so that it proves to the joiners the token of the record the members
 * keep for it (announced: the pid that record claims). */
reshard_status_t comm_local_carry(struct reshard_comm *c, const struct reshard_comm *old,
                                  pid_t announced);
/* Once the growth succeeded (old retired): the writers old let in (its members) are c's to
 * dismiss, so that destroying old does not shut them out. */
void comm_local_adopt(struct reshard_comm *c, struct reshard_comm *old);
/* Dismisses the writers this communicator let in (the last resets PR_SET_PTRACER) and frees
 * what open and verify kept. */
void comm_local_close(struct reshard_comm *c);
/* The abstract name of the local socket of the rank with pid `pid` and spare id `spare`, as
 * a process of user uid looks for it: "reshard-local/<uid>/<pid>/<spare's address>". Unique
 * per communicator of a process (the spare listener's port is its own); a process that takes
 * it first is told apart by its credentials, and costs only the local path. */
struct boot_id;
void comm_local_name(char *buf, size_t n, uid_t uid, pid_t pid, const struct boot_id *spare);
/* What verify concluded about rank q. */
enum comm_local_verdict comm_local_verdict(const struct reshard_comm *c, int q);
const char *comm_local_verdict_name(enum comm_local_verdict v);

/* Tests only: the hellos this process fills from now on announce pid instead of its own
 * (0: its own again), to play a rank that lies. */
void comm_local_test_announce_pid(pid_t pid);

#endif
