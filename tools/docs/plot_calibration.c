/* SPDX-License-Identifier: MIT */
/*
 * plot_calibration.c - `kvevict plot --calibration FILE --png PATH`: the
 * feasibility map of a committed `kvevict trace --calibrate --json` run
 * (docs/trace.md, "Calibration, version 3") as one figure of six panels,
 * one an observation, over the grid of heavy (x) by heavy_mass (y): a cell
 * is shaded by the number of the run's seeds on which the observation holds
 * there (one seed: holds or not), grey where it was not judged; on a
 * calibration run the chosen point is marked in every panel.
 *
 * The figure is drawn from the rows alone (calib_read), so it shows what
 * the docs' tables show. Data and script go to a temporary directory that
 * is removed afterwards.
 */
#define _POSIX_C_SOURCE 200809L
#include "calibrate.h"
#include "docs.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const panel_title[N_OBS] = {
    "(1) h2o window 32 retains less than streaming",
    "(2) h2o window 64 beats streaming on both metrics",
    "(3) the window's gain saturates at exactly 64",
    "(4) h2o's top-32 recall beats window, streaming, random",
    "(5) h2o and scissorhands within 0.01",
    "(6) streaming retains 0.7367",
};

void plot_calibration(const char *file, const char *png)
{
    if (strchr(png, '\'') || strchr(png, '\n'))
        die_usage("--png: quotes and newlines are not supported in '%s'", png);
    gp_require();
    calib_run r;
    calib_read(&r, file);
    size_t ns = r.seeds;
    char tmpl[4096], data[4200], mark[4200], script[4200];
    const char *dir = plot_tmpdir(tmpl, sizeof tmpl);
    snprintf(data, sizeof data, "%s/map.dat", dir);
    snprintf(mark, sizeof mark, "%s/chosen.dat", dir);
    snprintf(script, sizeof script, "%s/plot.gp", dir);
    FILE *f = fopen(data, "w");
    if (!f)
        die_input("%s: cannot create", data);
    fprintf(f, "# heavy index, heavy_mass index, then per observation the seeds it holds on\n");
    for (size_t j = 0; j < CALIB_N_MASS; j++) { /* gnuplot images: x fastest */
        for (size_t i = 0; i < CALIB_N_HEAVY; i++) {
            size_t p = i * CALIB_N_MASS + j;
            fprintf(f, "%zu %zu", i, j);
            for (int k = 0; k < N_OBS; k++) {
                size_t holds = 0, judged = 0;
                for (size_t s = 0; s < ns; s++) {
                    holds += r.rows[p * ns + s].outcome[k] == OBS_HOLDS;
                    judged += r.rows[p * ns + s].outcome[k] != OBS_NOT_JUDGED;
                }
                if (judged < ns)
                    fprintf(f, " NaN");
                else
                    fprintf(f, " %zu", holds);
            }
            fprintf(f, "\n");
        }
        fprintf(f, "\n");
    }
    gp_close(f, data);
    f = fopen(mark, "w");
    if (!f)
        die_input("%s: cannot create", mark);
    if (!r.fixed && ns == 1) {
        const calib_row *c = &r.rows[calib_choose(&r)];
        fprintf(f, "%zu %zu\n", c->i, c->j);
    }
    gp_close(f, mark);

    f = fopen(script, "w");
    if (!f)
        die_input("%s: cannot create", script);
    fprintf(f, "set terminal pngcairo size 1260,860 enhanced font 'Sans,10'\nset output ");
    gp_quote(f, png);
    fprintf(f, "\nset datafile missing 'NaN'\nset xtics (");
    for (size_t i = 0; i < CALIB_N_HEAVY; i++)
        fprintf(f, "%s'%zu' %zu", i ? ", " : "", calib_heavy[i], i);
    fprintf(f, ")\nset ytics (");
    for (size_t j = 1; j < CALIB_N_MASS; j += 2) {
        unsigned m = calib_mass_milli(j);
        fprintf(f, "%s'%u.%03u' %zu", j > 1 ? ", " : "", m / 1000, m % 1000, j);
    }
    fprintf(f, ")\nset xrange [-0.5:%d.5]\nset yrange [-0.5:%d.5]\n", CALIB_N_HEAVY - 1,
            CALIB_N_MASS - 1);
    fprintf(f, "set xlabel 'heavy (hitters per epoch)'\nset ylabel 'heavy_mass' noenhanced\n"
               "set palette defined (0 '#f2f2f2', 1 '#1f5fa8')\nset cbrange [0:%zu]\n",
            ns);
    if (ns > 1)
        fprintf(f, "set cbtics 1\nset cblabel 'seeds it holds on (of %zu)'\n", ns);
    else
        fprintf(f, "unset colorbox\n");
    fprintf(f, "set object 1 rectangle from graph 0,0 to graph 1,1 behind fc rgb '#9a9a9a' "
               "fs solid\n");
    unsigned s0 = r.rows[0].sink_units;
    if (r.fixed)
        fprintf(f,
                "set multiplot layout 2,3 title \"Where each observation holds, sink_mass "
                "fixed at %u.%05u, seeds %llu to %llu (grey: not judged, the masses exceed 1)\" "
                "font 'Sans,12' noenhanced\n",
                s0 / 100000, s0 % 100000, r.rows[0].seed, r.rows[ns - 1].seed);
    else
        fprintf(f,
                "set multiplot layout 2,3 title \"Where each observation holds on seed %llu, "
                "sink_mass fitted at every point (dark: holds; dot: the chosen point)\" "
                "font 'Sans,12' noenhanced\n",
                r.rows[0].seed);
    for (int k = 0; k < N_OBS; k++) {
        fprintf(f, "set title ");
        gp_quote(f, panel_title[k]);
        fprintf(f, " noenhanced\nplot '%s' using 1:2:%d with image notitle", data, 3 + k);
        if (!r.fixed && ns == 1)
            fprintf(f, ", '%s' using 1:2 with points pt 7 ps 1.6 lc rgb '#d62728' notitle", mark);
        fprintf(f, "\n");
    }
    fprintf(f, "unset multiplot\n");
    gp_close(f, script);
    int rc = gp_run(script);
    remove(script);
    remove(data);
    remove(mark);
    rmdir(dir);
    calib_free(&r);
    if (rc != 0)
        die_input("gnuplot failed (status %d)", rc);
    printf("wrote %s\n", png);
    finish_stdout();
}
