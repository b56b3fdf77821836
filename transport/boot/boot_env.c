/* SPDX-License-Identifier: Apache-2.0 */
/* The launcher environment (boot_env_read in bootstrap.h): this rank's place in the job and
 * rank 0's address, read from what torchrun, Open MPI or Slurm set. */
#include "boot_int.h"

#include "base/log.h"
#include "base/param.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct boot_launcher {
    const char *name, *rank, *size, *local_rank, *local_size;
};

static const struct boot_launcher boot_torchrun = {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                   "LOCAL_WORLD_SIZE"};
static const struct boot_launcher boot_ompi = {"Open MPI", "OMPI_COMM_WORLD_RANK",
                                               "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                               "OMPI_COMM_WORLD_LOCAL_SIZE"};
static const struct boot_launcher boot_slurm = {"Slurm", "SLURM_PROCID", "SLURM_NTASKS",
                                                "SLURM_LOCALID", NULL};

static const char *boot_env_get(const char *name)
{
    const char *v = name ? getenv(name) : NULL;
    return v && *v ? v : NULL;
}

static const struct boot_launcher *boot_env_launcher(void)
{
    if (boot_env_get("RANK") || boot_env_get("WORLD_SIZE"))
        return &boot_torchrun;
    if (boot_env_get("OMPI_COMM_WORLD_RANK") || boot_env_get("OMPI_COMM_WORLD_SIZE"))
        return &boot_ompi;
    if (boot_env_get("SLURM_PROCID"))
        return &boot_slurm;
    return NULL;
}

/* An integer variable in [lo, hi]; an optional one that is unset reads as -1. The value may be
 * followed by a suffix only where allow_rest says (Slurm's "4(x2),3"). */
static reshard_status_t boot_env_int(const struct boot_launcher *l, const char *name, int required,
                                     int allow_rest, long lo, long hi, int *out)
{
    const char *v = boot_env_get(name);
    char *end;
    if (!v && !required) {
        *out = -1;
        return RESHARD_OK;
    }
    if (!v)
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: %s launch: %s is not set", l->name,
                        name);
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || (*end && !allow_rest) || x < lo || x > hi)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: %s launch: %s=%s is not an integer in [%ld, %ld]", l->name,
                        name, v, lo, hi);
    *out = (int)x;
    return RESHARD_OK;
}

static reshard_status_t boot_env_ranks(const struct boot_launcher *l, struct boot_env *e)
{
    RS_CHECK(boot_env_int(l, l->size, 1, 0, 1, INT_MAX, &e->size));
    RS_CHECK(boot_env_int(l, l->rank, 1, 0, 0, e->size - 1, &e->rank));
    RS_CHECK(boot_env_int(l, l->local_rank, 0, 0, 0, e->size - 1, &e->local_rank));
    if (l != &boot_slurm)
        RS_CHECK(boot_env_int(l, l->local_size, 0, 0, 1, e->size, &e->local_size));
    else if (boot_env_get("SLURM_NTASKS_PER_NODE"))
        RS_CHECK(boot_env_int(l, "SLURM_NTASKS_PER_NODE", 1, 0, 1, e->size, &e->local_size));
    else
        RS_CHECK(boot_env_int(l, "SLURM_STEP_TASKS_PER_NODE", 0, 1, 1, e->size, &e->local_size));
    if (e->local_rank >= 0 && e->local_size >= 0 && e->local_rank >= e->local_size)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: %s launch: local rank %d is not below the %d ranks of its node",
                        l->name, e->local_rank, e->local_size);
    return RESHARD_OK;
}

/* The first host of a Slurm host list: "gpu[01-04,07],cpu3" gives "gpu01". */
static int boot_env_nodelist_first(const char *list, char *out, size_t n)
{
    size_t k = 0;
    for (const char *p = list; *p && *p != ','; p++) {
        if (*p != '[') {
            if (k + 1 < n)
                out[k++] = *p;
            continue;
        }
        for (p++; *p && *p != ']' && *p != ',' && *p != '-'; p++)
            if (k + 1 < n)
                out[k++] = *p;
        while (*p && *p != ']')
            p++;
        if (!*p)
            break;
    }
    out[k] = '\0';
    return k > 0 ? 0 : -1;
}

/* Rank 0's host and MASTER_PORT. */
static reshard_status_t boot_env_master(const struct boot_launcher *l, char *host, size_t n,
                                        int *port)
{
    const char *addr = boot_env_get("MASTER_ADDR");
    const char *list = boot_env_get("SLURM_STEP_NODELIST") ? boot_env_get("SLURM_STEP_NODELIST")
                                                           : boot_env_get("SLURM_JOB_NODELIST");
    if (addr) {
        snprintf(host, n, "%s", addr);
    } else if (l == &boot_slurm && list) {
        if (boot_env_nodelist_first(list, host, n) != 0)
            return rs_error(RESHARD_ERR_INVALID_ARG,
                            "bootstrap: Slurm launch: MASTER_ADDR is not set and the node list "
                            "'%s' names no host",
                            list);
    } else {
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: %s launch: MASTER_ADDR is not set: it must name rank 0's "
                        "host%s",
                        l->name,
                        l == &boot_slurm ? " (or SLURM_STEP_NODELIST / SLURM_JOB_NODELIST be set)"
                                         : "");
    }
    if (!boot_env_get("MASTER_PORT") && l == &boot_slurm) {
        *port = 29500;
        return RESHARD_OK;
    }
    return boot_env_int(l, "MASTER_PORT", 1, 0, 1, 65535, port);
}

/* The longest secret RESHARD_SECRET_FILE may hold. */
#define BOOT_SECRET_FILE_MAX 4096

/* The contents of RESHARD_SECRET_FILE (one trailing newline dropped) into buf. */
static reshard_status_t boot_env_secret_file(const char *path, char *buf, size_t cap, size_t *n)
{
    FILE *f = fopen(path, "re");
    struct stat sb;
    if (!f)
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: RESHARD_SECRET_FILE=%s: %m", path);
    size_t k = fread(buf, 1, cap, f);
    int bad = ferror(f), more = !bad && fgetc(f) != EOF;
    if (fstat(fileno(f), &sb) != 0)
        sb.st_mode = 0;
    fclose(f);
    if (bad)
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: RESHARD_SECRET_FILE=%s: read failed",
                        path);
    if (more)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: RESHARD_SECRET_FILE=%s holds more than %zu bytes", path, cap);
    if (k > 0 && buf[k - 1] == '\n')
        k--;
    if (k == 0)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: RESHARD_SECRET_FILE=%s is empty: it must hold the job's secret",
                        path);
    if (sb.st_mode & (S_IRWXG | S_IRWXO))
        rs_log(RS_LOG_WARN,
               "bootstrap: RESHARD_SECRET_FILE=%s can be read by other users (mode %03o): "
               "chmod 600 it",
               path, (unsigned)(sb.st_mode & 0777));
    *n = k;
    return RESHARD_OK;
}

/* Without a configured secret, every rank of one job derives the same one from what the
 * launcher sets: public values, so that anyone who can reach the port can join (said once). */
static reshard_status_t boot_env_public_secret(const struct boot_launcher *l, const char *host,
                                               int port, int size, unsigned char *secret)
{
    static atomic_int warned;
    char job[256] = "", s[1024];
    if (l == &boot_torchrun && boot_env_get("TORCHELASTIC_RUN_ID"))
        snprintf(job, sizeof(job), "%s", boot_env_get("TORCHELASTIC_RUN_ID"));
    else if (l == &boot_ompi &&
             (boot_env_get("OMPI_MCA_orte_ess_jobid") || boot_env_get("PMIX_NAMESPACE")))
        snprintf(job, sizeof(job), "%s",
                 boot_env_get("OMPI_MCA_orte_ess_jobid") ? boot_env_get("OMPI_MCA_orte_ess_jobid")
                                                         : boot_env_get("PMIX_NAMESPACE"));
    else if (l == &boot_slurm)
        snprintf(job, sizeof(job), "%s.%s",
                 boot_env_get("SLURM_JOB_ID") ? boot_env_get("SLURM_JOB_ID") : "",
                 boot_env_get("SLURM_STEP_ID") ? boot_env_get("SLURM_STEP_ID") : "");
    int n = snprintf(s, sizeof(s), "reshard|%s|%s|%s|%d|%d", l->name, job, host, port, size);
    if (size > 1 && !atomic_exchange(&warned, 1))
        rs_log(RS_LOG_WARN,
               "bootstrap: neither RESHARD_SECRET nor RESHARD_SECRET_FILE is set: the job's "
               "secret is derived from values anyone can read, so anyone who can reach rank 0's "
               "port (%s:%d) can join this job; give every rank the same secret "
               "(docs/security.md)",
               host, port);
    return size > 1 ? boot_secret_derive(s, (size_t)n, "reshard job secret", secret) : RESHARD_OK;
}

/* RESHARD_SECRET, else RESHARD_SECRET_FILE, else the public derivation. A job of one rank
 * admits nobody, so it needs no secret (nor libcrypto). */
static reshard_status_t boot_env_secret(const struct boot_launcher *l, const char *host, int port,
                                        int size, unsigned char *secret)
{
    const char *configured = rs_param_str(RS_PARAM_SECRET),
               *file = rs_param_str(RS_PARAM_SECRET_FILE);
    char buf[BOOT_SECRET_FILE_MAX];
    size_t n = 0;
    memset(secret, 0, BOOT_SECRET_BYTES);
    if (configured[0] && file[0])
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: RESHARD_SECRET and RESHARD_SECRET_FILE are both set: set one");
    if (!configured[0] && !file[0])
        return boot_env_public_secret(l, host, port, size, secret);
    if (file[0])
        RS_CHECK(boot_env_secret_file(file, buf, sizeof(buf), &n));
    if (size <= 1)
        return RESHARD_OK;
    return configured[0]
               ? boot_secret_derive(configured, strlen(configured), "reshard job secret", secret)
               : boot_secret_derive(buf, n, "reshard job secret", secret);
}

reshard_status_t boot_env_read(struct boot_env *out)
{
    const struct boot_launcher *l = boot_env_launcher();
    struct boot_env e;
    unsigned char secret[BOOT_SECRET_BYTES];
    union sock_addr a;
    char host[256];
    int master_port = 0, port = 0;
    if (!l)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: no launcher environment: set RANK and WORLD_SIZE (as "
                        "torchrun does), or launch with mpirun or srun; MASTER_ADDR and "
                        "MASTER_PORT name rank 0's host");
    RS_CHECK(boot_env_ranks(l, &e));
    RS_CHECK(boot_env_master(l, host, sizeof(host), &master_port));
    RS_CHECK(boot_param_port(&port));
    /* torchrun's own store holds MASTER_PORT. */
    port = port ? port : master_port + 1;
    if (port > 65535)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: MASTER_PORT=65535 leaves no port for rank 0 (MASTER_PORT+1): "
                        "set RESHARD_BOOT_PORT");
    RS_CHECK(boot_env_secret(l, host, port, e.size, secret));
    reshard_status_t st = sock_resolve(host, port, &a);
    if (st != RESHARD_OK) {
        char why[RS_ERROR_MAX];
        snprintf(why, sizeof(why), "%s", rs_error_message());
        return rs_error(
            st, "bootstrap: %s launch: rank 0's host %s (%s) does not resolve: %s", l->name, host,
            boot_env_get("MASTER_ADDR") ? "MASTER_ADDR" : "first host of the node list", why);
    }
    /* Rank 0 opens its listener as it starts to serve it: a connection there that is not
     * answered at once is not reshard's (boot_dial). */
    boot_id_encode(&a, secret, BOOT_ID_PROMPT, &e.id);
    *out = e;
    return RESHARD_OK;
}
