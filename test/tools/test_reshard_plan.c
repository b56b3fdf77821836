/* SPDX-License-Identifier: Apache-2.0 */
/* reshard-plan as a user runs it: report lines, JSON, exit statuses. */
#include "run_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define OUT_MAX (1 << 16)

static char out[OUT_MAX];

static int plan(const char *args)
{
    size_t n = strlen(args) + strlen(build_dir()) + 32;
    char *cmd = malloc(n);
    cr_assert_not_null(cmd);
    snprintf(cmd, n, "%s/reshard-plan %s", build_dir(), args);
    int rc = run_capture(cmd, out, sizeof(out));
    free(cmd);
    return rc;
}

static int lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* The value on the line "key N", or -1. */
static long long value_of(const char *key)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\n%s ", key);
    const char *p = strstr(out, pat);
    return p ? atoll(p + strlen(pat)) : -1;
}

Test(reshard_plan, report_ends_with_the_eight_lines, .timeout = 60)
{
    int rc = plan("--src 'shape=7168x2048 ranks=0-7 place=S(0)' "
                  "--dst 'shape=7168x2048 ranks=8-15 mesh=2x4 place=R,S(0)'");
    cr_assert_eq(rc, 0, "%s", out);
    static const char *const keys[] = {"net_bytes",   "min_net_bytes", "gather_bcast_bytes",
                                       "local_bytes", "max_nic_bytes", "lb_nic_bytes",
                                       "plan_ms",     "valid"};
    const char *p = out + strlen(out);
    for (int i = 7; i >= 0; i--) { /* walk the last 8 lines backwards */
        const char *line = p - 1;
        while (line > out && line[-1] != '\n')
            line--;
        cr_assert_eq(strncmp(line, keys[i], strlen(keys[i])), 0, "line %d is '%.*s'", i,
                     (int)(p - line), line);
        cr_assert_eq(line[strlen(keys[i])], ' ');
        p = line;
    }
    long long net = value_of("net_bytes");
    cr_assert_eq(net, 7168LL * 2048 * 2, "the tensor enters domain 1 once");
    cr_assert_eq(value_of("min_net_bytes"), net);
    cr_assert_eq(value_of("max_nic_bytes"), value_of("lb_nic_bytes"));
    cr_assert(strstr(out, "\nvalid yes\n"));
    cr_assert(strstr(out, "rank   dom  rail"), "the per-rank table is printed");
}

Test(reshard_plan, json_carries_the_same_figures, .timeout = 60)
{
    const char *args = "--src 'shape=64x64 ranks=0-3 place=S(1)' --dst 'shape=64x64 ranks=4-7 "
                       "mesh=2x2 place=SS(0,2),R' --domain-size 2";
    cr_assert_eq(plan(args), 0, "%s", out);
    long long net = value_of("net_bytes");
    char json_args[512];
    snprintf(json_args, sizeof(json_args), "%s --json", args);
    cr_assert_eq(plan(json_args), 0, "%s", out);
    char want[64];
    snprintf(want, sizeof(want), "\"net_bytes\": %lld,", net);
    cr_assert(strstr(out, want), "%s", out);
    cr_assert(strstr(out, "\"valid\": true"), "%s", out);
    cr_assert(strstr(out, "\"ranks\": ["), "%s", out);
}

Test(reshard_plan, bad_input_exits_2_with_one_line, .timeout = 60)
{
    cr_assert_eq(
        plan("--src 'shape=7168x2048 ranks=0-3 place=X' --dst 'shape=7168x2048 ranks=0-3'"), 2);
    cr_assert_str_eq(out, "error: place: expected R, S(d) or SS(d,k) at column 33 (in --src)\n");
    cr_assert_eq(plan("--src 'shape=4x4 ranks=0-3' --dst 'shape=4x4 ranks=0-3 mesh=2x3'"), 2);
    cr_assert_str_eq(out,
                     "error: mesh: 2x3 holds 6 ranks but ranks lists 4 at column 26 (in --dst)\n");
    cr_assert_eq(plan("--src 'shape=4x4 ranks=0-3' --dst 'shape=4x4 ranks=0-3 place=S(5)'"), 2);
    cr_assert_eq(plan("--src 'shape=6 ranks=0-3 place=SS(0,0)' --dst 'shape=6 ranks=0-3'"), 2);
    cr_assert_eq(plan("--src 'shape=4x4 ranks=0-3' --dst 'shape=4x4 dtype=f32 ranks=0-3'"), 2);
    cr_assert_str_eq(out, "error: tensor 'tensor': source dtype bf16 differs from destination "
                          "dtype f32\n");
    cr_assert_eq(plan("--src 'shape=4x4 ranks=0-3' --dst 'shape=4x8 ranks=0-3'"), 2);
    cr_assert_str_eq(out, "error: tensor 'tensor': source shape 4x4 differs from destination "
                          "shape 4x8\n");
}

/* Issue 27: the offset's span wrapped to 64 bytes and reshard-plan said "valid yes". */
Test(reshard_plan, a_view_offset_near_2_63_bytes_exits_2_naming_the_offset, .timeout = 60)
{
    cr_assert_eq(plan("--src 'shape=10 dtype=f64 ranks=0' --dst 'shape=10 dtype=f64 ranks=0 "
                      "buffer=b offset=2305843009213693950'"),
                 2, "%s", out);
    cr_assert_str_eq(out, "error: offset: the view of rank 0 reaches past byte 2^63 of its buffer "
                          "(offset 2305843009213693950, 10 elements of 8 bytes), which cannot be "
                          "addressed at column 44 (in --dst)\n");
    cr_assert_eq(plan("--src 'shape=10 dtype=f64 ranks=0 offset=2305843009213693950' "
                      "--dst 'shape=10 dtype=f64 ranks=1'"),
                 2, "%s", out);
    cr_assert(strstr(out, "(in --src)"), "%s", out);
}

Test(reshard_plan, usage_errors_exit_2, .timeout = 60)
{
    cr_assert_eq(plan("--src 'shape=4 ranks=0'"), 2);
    cr_assert_str_eq(out,
                     "error: --src and --dst (or --manifest) are required; --help says more\n");
    cr_assert_eq(plan("--src 'shape=4 ranks=0' --dst 'shape=4 ranks=1' --bogus"), 2);
    cr_assert_str_eq(out, "error: unknown option '--bogus' (--help lists them)\n");
    cr_assert_eq(plan("--src 'shape=4 ranks=0' --dst 'shape=4 ranks=1' -q"), 2);
    cr_assert_str_eq(out, "error: unknown option '-q' (--help lists them)\n");
    cr_assert_eq(plan("--dst 'shape=4 ranks=1' --src"), 2);
    cr_assert_str_eq(out, "error: --src needs a value\n");
    cr_assert_eq(plan("--src 'shape=4 ranks=0' --dst 'shape=4 ranks=1' --domain-size 0"), 2);
    cr_assert_eq(plan("--src 'shape=4 ranks=0' --dst 'shape=4 ranks=1' extra"), 2);
    cr_assert_eq(plan("--src 'shape=4 ranks=0' --dst 'shape=4 ranks=1' --domains 0,0 "
                      "--domain-size 2"),
                 2);
    cr_assert_eq(plan("--src 'shape=4 ranks=0' --dst 'shape=4 ranks=1' --domains 0,x"), 2);
    cr_assert_eq(plan("--src 'shape=4 ranks=0' --dst 'shape=4 ranks=2' --domains 0,1"), 2);
    cr_assert_str_eq(out, "error: --domains is too short: it lists 2 domain ids, the layouts use "
                          "ranks 0-2 (one id per rank)\n");
    cr_assert_eq(plan("--src 'shape=4 ranks=0' --dst 'shape=4 ranks=2' --world-size 2"), 2);
    cr_assert_str_eq(out, "error: rank 2 is outside the world of 2 ranks (--world-size)\n");
    cr_assert_eq(plan("--src 'shape=4 ranks=0' --dst 'shape=4 ranks=1' --domains 0,1 "
                      "--world-size 3"),
                 2);
    cr_assert_str_eq(out, "error: --domains is too short: it lists 2 domain ids, the world has 3 "
                          "ranks (one id per rank)\n");
    cr_assert_eq(plan("--src 'shape=4 ranks=0' --dst 'shape=4 ranks=1' --domains 0,1,1 "
                      "--world-size 2"),
                 2);
    cr_assert_str_eq(out, "error: --domains is too long: it lists 3 domain ids, the world has 2 "
                          "ranks (one id per rank)\n");
    cr_assert_eq(plan("--src 'shape=4' --dst 'shape=4'"), 2, "no rank count anywhere");
}

Test(reshard_plan, domains_list_and_world_size, .timeout = 60)
{
    cr_assert_eq(plan("--src 'shape=8 ranks=0-1 place=S(0)' --dst 'shape=8 ranks=2-3 place=R' "
                      "--domains 5,5,9,9"),
                 0, "%s", out);
    cr_assert_eq(value_of("net_bytes"), 16);
    cr_assert_eq(plan("--src 'shape=8 place=S(0)' --dst 'shape=8 place=R' --world-size 4 "
                      "--domain-size 2"),
                 0, "%s", out);
    cr_assert_eq(value_of("net_bytes"), 16, "both sides default to ranks 0-3");
    /* 64 B wanted: 16 B arrive by network, 16 B are kept (self), the rest moves locally */
    cr_assert_eq(value_of("local_bytes"), 32);
}

Test(reshard_plan, long_tables_are_cut_unless_asked, .timeout = 60)
{
    const char *args = "--src 'shape=64x64 ranks=0-63 place=S(0)' --dst 'shape=64x64 ranks=0-63 "
                       "place=S(1)'";
    cr_assert_eq(plan(args), 0);
    cr_assert(strstr(out, "... 32 more ranks with traffic (--all-ranks lists them)"), "%s", out);
    char all[512];
    snprintf(all, sizeof(all), "%s --all-ranks", args);
    cr_assert_eq(plan(all), 0);
    cr_assert_null(strstr(out, "more ranks with traffic"));
    cr_assert(strstr(out, "\n    63 "), "rank 63 listed");
}

Test(reshard_plan, dump_config_and_help, .timeout = 60)
{
    cr_assert_eq(plan("--dump-config"), 0);
    cr_assert(strstr(out, "RESHARD_DEBUG"), "%s", out);
    cr_assert(strstr(out, "RESHARD_PLAN_SPLIT_MIN_BYTES"), "%s", out);
    cr_assert_eq(plan("--help"), 0);
    cr_assert(strstr(out, "usage: reshard-plan"), "%s", out);
    cr_assert_eq(plan("-h --bogus"), 0, "help comes first: %s", out);
    cr_assert_eq(strncmp(out, "usage: reshard-plan", 19), 0, "%s", out);
}

/* The README's settings table names every setting --dump-config shows (the tests run from the
 * repository root). */
Test(reshard_plan, the_readme_lists_every_setting, .timeout = 60)
{
    cr_assert_eq(plan("--dump-config"), 0, "%s", out);
    FILE *f = fopen("README.md", "r");
    cr_assert_not_null(f, "README.md from the repository root");
    static char readme[1 << 18];
    size_t n = fread(readme, 1, sizeof(readme) - 1, f);
    fclose(f);
    readme[n] = '\0';
    int settings = 0;
    for (char *line = out; *line;) {
        char *end = strchr(line, '\n'), name[64], want[72];
        if (sscanf(line, "%63s", name) == 1 && !strncmp(name, "RESHARD_", 8)) {
            snprintf(want, sizeof(want), "| `%s` |", name);
            cr_assert_not_null(strstr(readme, want), "README.md has no row for %s", name);
            settings++;
        }
        if (!end)
            break;
        line = end + 1;
    }
    cr_assert_gt(settings, 30, "%d settings in:\n%s", settings, out);
}

Test(reshard_plan, bad_world_size_and_long_rank_lists, .timeout = 60)
{
    cr_assert_eq(plan("--src 'shape=4 ranks=0' --dst 'shape=4 ranks=1' --world-size x"), 2);
    cr_assert_str_eq(out, "error: --world-size: expected a positive integer: x\n");
    /* 1,000 scattered ranks: the canonical spec runs past any fixed buffer */
    char ranks[8192] = "";
    size_t n = 0;
    for (int r = 0; r < 2000; r += 2)
        n += (size_t)snprintf(ranks + n, sizeof(ranks) - n, "%s%d", r ? "," : "", r);
    char *args = malloc(3 * sizeof(ranks));
    snprintf(args, 3 * sizeof(ranks),
             "--src 'shape=1000 ranks=%s place=S(0)' --dst 'shape=1000 ranks=1 place=R' "
             "--domain-size 2",
             ranks);
    cr_assert_eq(plan(args), 0, "%s", out);
    cr_assert(strstr(out, ",1998 mesh=1000 place=S(0)\n"), "the whole spec is printed");
    free(args);
}

/* ---- --manifest, on manifests that scripts/gen-manifest.py writes ---- */

/* Writes a manifest with gen-manifest.py into path; returns its exit status. */
static int gen(const char *args, const char *path)
{
    return run_capturef(out, sizeof(out), "scripts/gen-manifest.py %s -o %s", args, path);
}

Test(reshard_plan, a_whole_model_manifest_plans_every_tensor_at_the_minimum, .timeout = 120)
{
    char path[] = "/tmp/reshard-gen-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    int rc = gen("--model qwen3-30b-a3b --train ep=8,pp=2,dp=8 --infer tp=8,dp=2 --scale 16", path);
    cr_assert_eq(rc, 0, "%s", out);
    char args[256];
    snprintf(args, sizeof(args), "--manifest %s", path);
    rc = plan(args);
    unlink(path);
    cr_assert_eq(rc, 0, "%s", out);
    /* 48 layers of (2 norms, q/k/v/o, q/k norms, router, 128 experts x 2) + embed, norm, head */
    cr_assert_eq(value_of("tensors"), 48 * (2 + 4 + 2 + 1 + 128 * 2) + 3, "%s", out);
    cr_assert_gt(value_of("net_bytes"), 0);
    cr_assert_eq(value_of("net_bytes"), value_of("min_net_bytes"), "%s", out);
    cr_assert(strstr(out, "\nvalid yes"), "%s", out);
    cr_assert(strstr(out, "world: 32 ranks in 4 domains"), "%s", out);
}

Test(reshard_plan, a_bad_manifest_is_exit_status_2_naming_the_tensor, .timeout = 60)
{
    char path[] = "/tmp/reshard-bad-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    const char *json = "{\"version\": 1, \"world_size\": 4, \"tensors\": [{\"name\": \"w\", "
                       "\"shape\": [8], \"dtype\": \"bf16\", \"src\": \"ranks=0-1 place=Q\", "
                       "\"dst\": \"ranks=2-3\"}]}";
    cr_assert_eq(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    char args[256];
    snprintf(args, sizeof(args), "--manifest %s", path);
    int rc = plan(args);
    unlink(path);
    cr_assert_eq(rc, 2, "%s", out);
    cr_assert(strstr(out, "tensors[0] (w).src: place"), "%s", out);
    cr_assert_eq(plan("--manifest /tmp/x.json --src 'shape=4'"), 2, "%s", out);
}

Test(reshard_plan, gen_manifest_refuses_configs_that_do_not_fit, .timeout = 60)
{
    cr_assert_eq(gen("--model qwen3-30b-a3b --train ep=7,pp=2,dp=8 --infer tp=8", "/dev/null"), 2,
                 "%s", out);
    cr_assert(strstr(out, "not a multiple of etp*ep"), "%s", out);
    cr_assert_eq(gen("--model llama-3.1-70b --train tp=16 --infer tp=8", "/dev/null"), 2, "%s",
                 out);
    cr_assert(strstr(out, "must divide the 8 kv heads"), "%s", out);
    cr_assert_eq(gen("--model llama-3.1-70b --train tp=8,zz=2 --infer tp=8", "/dev/null"), 2, "%s",
                 out);
    cr_assert(strstr(out, "unknown key 'zz'"), "%s", out);
}

/* ---- --cluster: the predicted refit time of each algorithm ---- */

static double predicted(const char *algo)
{
    char key[64];
    snprintf(key, sizeof(key), "\npredicted_%s_s ", algo);
    const char *p = strstr(out, key);
    cr_assert_not_null(p, "no %s prediction:\n%s", algo, out);
    return atof(p + strlen(key));
}

/* 256 MiB replicated onto 8 ranks of one domain: reshard crosses the NIC once per domain and
 * fans out over NVLink, direct sends every replica over the network. */
Test(reshard_plan, cluster_prediction_favours_one_crossing_per_domain, .timeout = 60)
{
    int rc = plan("--src 'shape=16384x8192 ranks=0-7 place=S(0)' "
                  "--dst 'shape=16384x8192 ranks=8-15 place=R' "
                  "--cluster nic=50GB/s,nvlink=450GB/s,latency=5us");
    cr_assert_eq(rc, 0, "%s", out);
    double r = predicted("reshard"), d = predicted("direct"), b = predicted("bcast");
    /* direct: each destination rank takes 256 MiB over its own NIC: 268 MB / 50 GB/s, and
     * rank 0..7's 64 messages of 4 MiB cost 4 latencies (16 in flight). */
    cr_assert(d > 0.0050 && d < 0.0060, "direct %.4f s:\n%s", d, out);
    cr_assert_lt(r, d / 4, "reshard %.4f s, direct %.4f s:\n%s", r, d, out);
    cr_assert_gt(b, r, "%s", out);
    cr_assert(strstr(out, "not a measurement"), "%s", out);
}

Test(reshard_plan, cluster_spec_errors_are_exit_status_2, .timeout = 60)
{
    const char *pair = "--src 'shape=64x64 ranks=0-1 place=S(0)' --dst 'shape=64x64 ranks=2-3' ";
    char args[256];
    snprintf(args, sizeof(args), "%s --cluster nic=50GB/s,nvlink=450GB/s", pair);
    cr_assert_eq(plan(args), 2, "%s", out);
    cr_assert(strstr(out, "all needed"), "%s", out);
    snprintf(args, sizeof(args), "%s --cluster nic=50GiB,nvlink=450GB/s,latency=5us", pair);
    cr_assert_eq(plan(args), 2, "%s", out);
    cr_assert(strstr(out, "'nic=50GiB': expected a positive rate"), "%s", out);
    snprintf(args, sizeof(args), "%s --cluster nic=400Gb/s,nvlink=450GB/s,latency=-1us", pair);
    cr_assert_eq(plan(args), 2, "%s", out);
    snprintf(args, sizeof(args), "%s --json --cluster nic=400Gb/s,nvlink=450GB/s,latency=1us",
             pair);
    cr_assert_eq(plan(args), 2, "%s", out);
    snprintf(args, sizeof(args), "%s --cluster nic=400Gb/s,nvlink=450GB/s,latency=1us", pair);
    cr_assert_eq(plan(args), 0, "%s", out);
    snprintf(args, sizeof(args), "%s --cluster nic=5,nvlink=450GB/s,latency=1us", pair);
    cr_assert_eq(plan(args), 2, "%s", out);
    cr_assert_str_eq(out, "error: --cluster: 'nic=5': expected a positive rate like 50GB/s or "
                          "400Gb/s\n");
    snprintf(args, sizeof(args), "%s --cluster nic=1GB/s,nic=2GB/s,nvlink=4GB/s,latency=1us", pair);
    cr_assert_eq(plan(args), 2, "%s", out);
    cr_assert_str_eq(out, "error: --cluster: nic is given twice\n");
    snprintf(args, sizeof(args), "%s --cluster nic=infGB/s,nvlink=4GB/s,latency=1us", pair);
    cr_assert_eq(plan(args), 2, "an endless NIC is no rate: %s", out);
}

/* --cluster is read with the other options, before anything is loaded or planned: a bad value
 * is reported even when the manifest named beside it does not exist. */
Test(reshard_plan, cluster_is_checked_before_the_manifest_is_read, .timeout = 60)
{
    cr_assert_eq(plan("--manifest /nonexistent/m.json --cluster nic=50GB/s,nvlink=1GB/s,lat=5us"),
                 2, "%s", out);
    cr_assert_str_eq(out, "error: --cluster: 'lat=5us': expected nic=RATE,nvlink=RATE,latency=TIME "
                          "(RATE like 50GB/s or 400Gb/s, TIME like 5us)\n");
}

Test(reshard_plan, a_manifest_from_standard_input_plans_as_from_its_file, .timeout = 60)
{
    cr_assert_eq(plan("--manifest docs/examples/fused-qkv.json"), 0, "%s", out);
    long long net = value_of("net_bytes"), local = value_of("local_bytes");
    cr_assert_gt(net, 0);
    cr_assert_eq(plan("--manifest - < docs/examples/fused-qkv.json"), 0, "%s", out);
    cr_assert_eq(value_of("net_bytes"), net, "%s", out);
    cr_assert_eq(value_of("local_bytes"), local, "%s", out);
    cr_assert(strstr(out, "manifest: -, 5 tensors\n"), "%s", out);
    cr_assert_eq(plan("--manifest - < /dev/null"), 2, "%s", out);
    cr_assert_eq(strncmp(out, "error: manifest <stdin>:", 24), 0, "naming stdin: %s", out);
    cr_assert_eq(lines(out), 1, "%s", out);
}

/* The library logs a failure it returns at WARN; the tool prints it itself, so it tells the
 * library not to, and the user reads one line. */
Test(reshard_plan, a_failure_is_one_line, .timeout = 60)
{
    cr_assert_eq(plan("--src 'shape=8 ranks=0-3 place=S(0)' --dst 'shape=8 ranks=0-3 place=R' "
                      "--exclude 3"),
                 3, "%s", out);
    cr_assert_str_eq(out, "error: plan: 1 tensor cannot be refit: a piece that a destination needs "
                          "was held only by ranks that left, and no replica remains: 'tensor' "
                          "(held by rank 3 only)\n");
    cr_assert_eq(plan("--src 'shape=8 ranks=0-3 place=S(0)' --dst 'shape=8 ranks=0-3' --rank 4"),
                 2);
    cr_assert_str_eq(out, "error: --rank 4: the world has 4 ranks (0-3)\n");
}

/* A misspelled setting is one WARN naming the right one, a malformed value one WARN, and
 * --dump-config shows the values in force. */
Test(reshard_plan, bad_settings_are_one_warning_and_the_table_shows_what_is_in_force, .timeout = 60)
{
    int rc = run_capturef(out, sizeof(out),
                          "RESHARD_TIMOUT=3 RESHARD_TIMEOUT=soon RESHARD_DEBUG=warn "
                          "%s/reshard-plan --dump-config",
                          build_dir());
    cr_assert_eq(rc, 0, "%s", out);
    const char *warn = strstr(out, "RESHARD WARN RESHARD_TIMOUT=3 is not a reshard setting (did "
                                   "you mean RESHARD_TIMEOUT?); ignored\n");
    cr_assert_not_null(warn, "%s", out);
    cr_assert_null(strstr(strchr(warn, '\n'), "RESHARD_TIMOUT"), "said once: %s", out);
    cr_assert(strstr(out, "RESHARD WARN RESHARD_TIMEOUT=soon is not an integer; the default "
                          "stays\n"),
              "%s", out);
    cr_assert(strstr(out, "\nRESHARD_TIMEOUT                300          default  # "), "%s", out);
    cr_assert(strstr(out, "\nRESHARD_DEBUG                  WARN         env      # "), "%s", out);
}

/* gen-manifest.py writes the sizes of the buffers its views share, and they hold exactly the
 * views: one element less is refused, naming the tensor. */
Test(reshard_plan, generated_buffer_sizes_are_exact, .timeout = 120)
{
    char path[] = "/tmp/reshard-sizes-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    int rc = gen("--model llama-3.1-70b --train tp=8,pp=4,dp=2 --infer tp=4,dp=8 --scale 64", path);
    cr_assert_eq(rc, 0, "%s", out);
    char args[256];
    snprintf(args, sizeof(args), "--manifest %s", path);
    cr_assert_eq(plan(args), 0, "%s", out);
    rc = run_capturef(
        out, sizeof(out),
        "python3 -c \"import json,sys; p=sys.argv[1]; d=json.load(open(p)); "
        "d['buffers']['model.layers.3.qkv_proj'] -= 1; json.dump(d, open(p, 'w'))\" %s",
        path);
    cr_assert_eq(rc, 0, "%s", out);
    rc = plan(args);
    unlink(path);
    cr_assert_eq(rc, 2, "%s", out);
    cr_assert(strstr(out, "(model.layers.3.self_attn.v_proj.weight).dst: its view reaches element"),
              "%s", out);
}

/* As after a shrink: a gone replica's pieces come from the other one, for the same bytes; with
 * both gone the data is lost (exit 3, naming the tensor and its holders). */
Test(reshard_plan, excluded_ranks_are_replaced_by_replicas_or_reported_lost, .timeout = 60)
{
    const char *pair = "--src 'shape=64x64 ranks=0-3 mesh=2x2 place=R,S(0)' "
                       "--dst 'shape=64x64 ranks=4-5 mesh=2 place=S(1)' --domain-size 2";
    char args[512];
    cr_assert_eq(plan(pair), 0, "%s", out);
    long long net = value_of("net_bytes");
    snprintf(args, sizeof(args), "%s --exclude 1 --all-ranks", pair);
    cr_assert_eq(plan(args), 0, "%s", out);
    cr_assert_eq(value_of("net_bytes"), net, "the same bytes cross, from the replica");
    cr_assert(strstr(out, "\nvalid yes\n"), "%s", out);
    cr_assert(strstr(out, "excluded (gone, as after a shrink): 1\n"), "%s", out);
    cr_assert_null(strstr(out, "\n     1 "), "rank 1 has no traffic:\n%s", out);
    snprintf(args, sizeof(args), "%s --exclude 1,3", pair);
    cr_assert_eq(plan(args), 3, "%s", out);
    cr_assert(strstr(out, "1 tensor cannot be refit") && strstr(out, "'tensor' (held by ranks 1, 3 "
                                                                     "only)"),
              "%s", out);
    snprintf(args, sizeof(args), "%s --exclude 6", pair);
    cr_assert_eq(plan(args), 2, "%s", out);
    cr_assert(strstr(out, "--exclude: topology: rank 6 is outside 0..5"), "%s", out);
    snprintf(args, sizeof(args), "%s --exclude one", pair);
    cr_assert_eq(plan(args), 2, "%s", out);
}

/* --catch-up: the joiner's shard from the replica that holds it, the sources sending nothing;
 * one rank's share of it alone; bad lists refused. */
Test(reshard_plan, a_catch_up_reports_what_the_joiners_receive_from_the_replicas, .timeout = 60)
{
    const char *pair = "--src 'shape=64x48 dtype=i32 ranks=0-3 mesh=4 place=S(0)' "
                       "--dst 'shape=64x48 dtype=i32 ranks=4-7 mesh=2x2 place=R,S(1)' "
                       "--domain-size 2";
    char args[512];
    snprintf(args, sizeof(args), "%s --catch-up 7 --all-ranks", pair);
    cr_assert_eq(plan(args), 0, "%s", out);
    cr_assert(strstr(out, "catch-up of ranks 7 (joined, holding nothing)"), "%s", out);
    cr_assert_eq(value_of("net_bytes"), 64 * 24 * 4, "its TP shard, once");
    cr_assert_eq(value_of("min_net_bytes"), 64 * 24 * 4);
    cr_assert(strstr(out, "\nvalid yes\n"), "%s", out);
    for (int r = 0; r < 4; r++) {
        char row[32];
        snprintf(row, sizeof(row), "\n     %d ", r);
        cr_assert_null(strstr(out, row), "trainer %d has traffic:\n%s", r, out);
    }
    snprintf(args, sizeof(args), "%s --catch-up 7 --rank 5", pair);
    cr_assert_eq(plan(args), 0, "%s", out);
    cr_assert_eq(value_of("rank_ops"), 1, "%s", out);
    snprintf(args, sizeof(args), "%s --catch-up 7,7", pair);
    cr_assert_eq(plan(args), 2, "%s", out);
    cr_assert(strstr(out, "joiner 7 is listed twice"), "%s", out);
    snprintf(args, sizeof(args), "%s --catch-up seven", pair);
    cr_assert_eq(plan(args), 2, "%s", out);
}

Test(reshard_plan, quantized_destinations_report_the_share_quantized_at_the_senders, .timeout = 60)
{
    /* 512 rows on 3 ranks: block rows 0 and 3 are held whole (FP8 on the wire), 1 and 2 not */
    const char *args = "--src 'shape=512x128 dtype=bf16 ranks=0-2 place=S(0)' --dst "
                       "'shape=512x128 dtype=fp8e5m2 ranks=4-5 place=S(0) quant=block(128,64)' "
                       "--domain-size 2";
    cr_assert_eq(plan(args), 0, "%s", out);
    cr_assert_eq(value_of("quant_bytes"), 512 * 128, "%s", out);
    cr_assert(strstr(out, "\nquant_at_source_pct 50.0\n"), "%s", out);
    cr_assert(strstr(out, "\nvalid yes\n"), "%s", out);
    char json_args[512];
    snprintf(json_args, sizeof(json_args), "%s --json", args);
    cr_assert_eq(plan(json_args), 0, "%s", out);
    cr_assert(strstr(out, "\"quant_at_source_pct\": 50.0"), "%s", out);
    cr_assert_eq(plan("--src 'shape=64x64 ranks=0-3 place=S(1)' --dst 'shape=64x64 ranks=4-7'"), 0);
    cr_assert_null(strstr(out, "quant_"), "no such lines without a quantized destination");
}

/* --infer-quant block128: every decoder linear weight FP8 with 128x128 block scales, quantized
 * by the training ranks (each holds whole weights): about half the bytes of the bf16 refit. */
Test(reshard_plan, an_fp8_inference_side_quantizes_at_the_senders_and_halves_the_bytes,
     .timeout = 180)
{
    long long net[2];
    for (int q = 0; q < 2; q++) {
        char path[] = "/tmp/reshard-gen-XXXXXX";
        int fd = mkstemp(path);
        cr_assert_geq(fd, 0);
        close(fd);
        char gargs[256];
        snprintf(gargs, sizeof(gargs),
                 "--model qwen3-30b-a3b --train ep=8,pp=2,dp=8 --infer tp=4,dp=2,ep=8%s",
                 q ? " --infer-quant block128" : "");
        int rc = gen(gargs, path);
        cr_assert_eq(rc, 0, "%s", out);
        char args[256];
        snprintf(args, sizeof(args), "--manifest %s", path);
        rc = plan(args);
        unlink(path);
        cr_assert_eq(rc, 0, "%s", out);
        cr_assert(strstr(out, "\nvalid yes"), "%s", out);
        net[q] = value_of("net_bytes");
        cr_assert_eq(net[q], value_of("min_net_bytes"), "%s", out);
        if (q)
            cr_assert(strstr(out, "\nquant_at_source_pct 100.0\n"), "%s", out);
        else
            cr_assert_null(strstr(out, "quant_"), "%s", out);
    }
    cr_assert_gt(net[1], 0);
    cr_assert_leq(net[1] * 100, net[0] * 52, "FP8 %lld bytes, bf16 %lld", net[1], net[0]);
}

/* Issue 27, the lesser finding: a tensor name with an escape sequence (JSON "\u001b[2J", which
 * clears a terminal) and a newline (which forges a line of its own) reached the terminal raw in
 * reshard-plan's error. Now every control character of an error or a log line is a '?'. */
Test(reshard_plan, a_tensor_name_with_an_escape_sequence_reaches_the_terminal_cleaned,
     .timeout = 60)
{
    char path[] = "/tmp/reshard-esc-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    const char *json = "{\"version\": 1, \"world_size\": 4, \"tensors\": [{\"name\": "
                       "\"w\\u001b[2J\\nerror: forged\", \"shape\": [8], \"dtype\": \"bf16\", "
                       "\"src\": \"ranks=0-1 place=Q\", \"dst\": \"ranks=2-3\"}]}";
    cr_assert_eq(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    char args[256];
    snprintf(args, sizeof(args), "--manifest %s", path);
    int rc = plan(args);
    unlink(path);
    cr_assert_eq(rc, 2, "%s", out);
    cr_assert_null(strchr(out, '\x1b'), "an escape reached the terminal: %s", out);
    cr_assert(strstr(out, "tensors[0] (w?[2J?error: forged).src: place"), "%s", out);
    cr_assert_eq(lines(out), 1, "%s", out);
}
