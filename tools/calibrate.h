/* SPDX-License-Identifier: MIT */
/*
 * calibrate.h - the declared calibration of the canonical trace's version 3
 * (docs/trace.md, "Calibration, version 3"): `kvevict trace --calibrate`,
 * the docs' `calibration` block and `kvevict plot --calibration` (the last
 * two in kvevict-docs, tools/docs/), all over one set of rows (calibrate.c).
 *
 * A row is one grid point (heavy, heavy_mass) on one trace seed: the
 * sink_mass it was evaluated at (fitted, or fixed by --sink-mass), how the
 * fit ended, the six observations judged by `kvevict bench`'s own code, and
 * the figures those judgements read. Rows are written as JSON Lines (one
 * object a row, keys in a fixed order) and read back from a committed file,
 * so the docs and the figure show exactly what the run printed.
 */
#ifndef KVE_CALIBRATE_H
#define KVE_CALIBRATE_H

#include <stddef.h>
#include <stdio.h>

#include "cli.h"

/* The grid: heavy (hitters per epoch) by heavy_mass (the heavy class). */
enum { CALIB_N_HEAVY = 10, CALIB_N_MASS = 16, CALIB_N_POINTS = CALIB_N_HEAVY * CALIB_N_MASS };
extern const size_t calib_heavy[CALIB_N_HEAVY];
/* heavy_mass of column j, in thousandths: 25 * (j + 1). */
unsigned calib_mass_milli(size_t j);

/* How a point's sink_mass was set. */
typedef enum {
    CALIB_FIT_OK,     /* bisection: f(hi) rounds to 0.7367 */
    CALIB_FIT_MISSED, /* bisection: no grid value rounds to it */
    CALIB_FIT_BELOW,  /* f(top) < 0.73665: no sink_mass reaches the figure */
    CALIB_FIT_ABOVE,  /* f(0) >= 0.73665: even no sinks is too much */
    CALIB_FIT_FIXED   /* --sink-mass: nothing fitted (the outside check) */
} calib_fit;

/* The figures a row keeps: what the criteria read. */
enum {
    CF_STREAMING_MASS_256,
    CF_STREAMING_RECALL_256,
    CF_STREAMING_RECALL_512,
    CF_H2O_W16_MASS_256,
    CF_H2O_W32_MASS_256, /* h2o at its defaults */
    CF_H2O_W48_MASS_256,
    CF_H2O_W64_MASS_256,
    CF_H2O_W80_MASS_256,
    CF_H2O_W96_MASS_256,
    CF_H2O_W128_MASS_256,
    CF_H2O_W64_RECALL_256,
    CF_H2O_RECALL_256,
    CF_H2O_MASS_512,
    CF_H2O_RECALL_512,
    CF_SCISSORHANDS_MASS_256,
    CF_SCISSORHANDS_RECALL_256,
    CF_SCISSORHANDS_MASS_512,
    CF_SCISSORHANDS_RECALL_512,
    CF_WINDOW_RECALL_256,
    CF_WINDOW_RECALL_512,
    CF_RANDOM_RECALL_256,
    CF_RANDOM_RECALL_512,
    /* From replays of scissorhands and h2o at their defaults: the step from
     * which scissorhands's every victim is the position leaving its window
     * (t - 32 at step t), and the positions from after the first epoch (>=
     * 512) that each holds outside its window at the end of the trace. */
    CF_SC_FROZEN_256,
    CF_SC_FROZEN_512,
    CF_SC_LATE_256,
    CF_SC_LATE_512,
    CF_H2O_LATE_256,
    CF_H2O_LATE_512,
    CF_COUNT
};

typedef struct calib_row {
    size_t i, j;          /* grid indices: heavy calib_heavy[i], heavy_mass column j */
    unsigned sink_units;  /* sink_mass in units of 0.00001 */
    calib_fit fit;
    unsigned fit_evals;   /* evaluations of f the fit took */
    unsigned long long seed; /* the trace seed */
    int outcome[N_OBS];   /* OBS_* */
    double fig[CF_COUNT];
    char *trace;          /* the trace's full canonical source */
} calib_row;

/* A run's rows, point-major (grid order), then seed. */
typedef struct calib_run {
    size_t n;
    calib_row *rows;
    size_t seeds; /* rows per point (1 for the calibration itself) */
    int fixed;    /* sink_mass fixed (the outside check) */
} calib_run;

/* The observations the calibration targets on version 3 (bit k: observation
 * k + 1): those holding at its chosen point on seed 1, (1) to (4) and (6).
 * tests/test_calibration_v3.sh holds this to the committed run. */
#define CALIB_V3_TARGETS 0x2Fu

/* bench and the docs, after the observations: on version 3 (the default
 * canonical trace) a paragraph saying which are calibration targets and,
 * from replays of scissorhands and h2o on the trace, why (5) cannot hold
 * with (4); nothing on any other trace. */
void calib_observations_note(FILE *f, int markdown, const char *trace);
/* bench --seeds, under its rule: on version 3, which claims were targets on
 * the first seed. `calibrated` is is_calibrated_trace's value. */
void calib_seeds_note(FILE *f, int calibrated, int markdown);

/* "--calibrate" is among the words of `kvevict trace`. */
int calibrate_requested(int argc, char **argv);
/* `kvevict trace --calibrate ...` (argv: the words after "trace"). */
int cmd_trace_calibrate(int argc, char **argv);

/* Reads rows written by --json back (exits on a malformed file or a row
 * off the grid). */
void calib_read(calib_run *r, const char *path);
void calib_free(calib_run *r);
/* The chosen point by the declared objective and tie-breaks, as an index
 * into r->rows; r must be a calibration run (one seed, fitted). */
size_t calib_choose(const calib_run *r);

/* The docs block `calibration FILE part=map|sink|pairs|argument|choice|outside`
 * (docs/cmd_docs.c): one part of the report on a committed run. The figure,
 * `kvevict plot --calibration`, is the documentation tool's
 * (docs/plot_calibration.c, declared in docs/docs.h). */
void render_calibration_block(FILE *f, char *const *args, size_t n_args);

#endif /* KVE_CALIBRATE_H */
