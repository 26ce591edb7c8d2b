/* The report's scalar walks in C: what llmlb_bench/metrics/pacing.py and distribution.py do in NumPy
 * passes over a run's token sample, and fairness.py over a run's rows, done here in one pass each, with the same floating-point
 * operations in the same order, so that every result is the NumPy path's to the last bit.
 *
 * Built by setup.py beside the compiled simulator core (compiled_core.KERNELS) and loaded only while
 * the core is (its source's hash is in the core's manifest); without it the NumPy code runs, and it
 * stays the reference (tests/test_report_kernels.py compares the two on random streams, bit for bit).
 * Compiled with -ffp-contract=off: no multiply-add is fused, as NumPy's separate passes never fuse one.
 *
 * Arrays come through the buffer protocol (NumPy arrays, C-contiguous): float64 ('d'), int64 ('l' or
 * 'q'), int32 ('i'), bool ('?'); the caller allocates the outputs. A run's token segments come as
 * Arrow gives them (pacing.Segments): each request's range of segments (``seg``: n + 1 offsets from
 * 0), their start, gap and count (int32); a segment's tail, ``gap x (count - 1)``, is computed here as
 * NumPy computes it (the count as an int64, then a double: exact), and a segment "after" another is
 * one that is not its request's first. No NumPy headers: the build needs only Python's.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_buffers.h"

/* ---- the streams' layout (pacing.Streams.of) -------------------------------------------------- */

/* Checks a run's segments: ``seg`` rises from 0 to the number of segments. */
static const char *check_segments(const int64_t *seg, Py_ssize_t np1, Py_ssize_t ns) {
    if (np1 < 1 || seg[0] != 0 || seg[np1 - 1] != ns) return "segment offsets that do not cover the segments";
    for (Py_ssize_t r = 0; r + 1 < np1; r++)
        if (seg[r + 1] < seg[r]) return "segment offsets that fall";
    return NULL;
}

/* entry_counts(seg, count, length): each request's number of entries: per segment, one for the gap
 * from the previous segment of its request and one for its own count - 1 gaps (count > 1). */
static PyObject *entry_counts(PyObject *self, PyObject *args) {
    PyObject *o[3];
    if (!PyArg_ParseTuple(args, "OOO", &o[0], &o[1], &o[2])) return NULL;
    Buffers b = {.n = 0};
    Py_ssize_t np1, ns, n;
    const int64_t *seg = take(&b, o[0], 'q', 0, &np1, "seg");
    const int32_t *count = seg ? take(&b, o[1], 'i', 0, &ns, "count") : NULL;
    int64_t *length = count ? take(&b, o[2], 'q', 1, &n, "length") : NULL;
    if (!length) { release(&b); return NULL; }
    const char *err = n + 1 != np1 ? "arrays of different lengths" : check_segments(seg, np1, ns);
    if (err) return bad(&b, err);
    for (Py_ssize_t r = 0; r < n; r++) {
        int64_t e = 0;
        for (int64_t s = seg[r]; s < seg[r + 1]; s++) e += (s > seg[r]) + (count[s] > 1);
        length[r] = e;
    }
    release(&b);
    Py_RETURN_NONE;
}

/* layout(seg, count, start, gap, by_rank, offsets, value, mult): every entry to its slot
 * ``offsets[p] + rank`` (p: its place in its request's stream; ``by_rank``: the request at each rank).
 * The requests go in rank order, so that consecutive ones fill consecutive slots of each position's
 * block (a cache line serves eight), where going in row order sent every entry to a line of its own.
 * The gap between two segments is ``start - (previous start + previous tail)``, as Streams.of computes it. */
static PyObject *layout(PyObject *self, PyObject *args) {
    PyObject *o[8];
    if (!PyArg_ParseTuple(args, "OOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7]))
        return NULL;
    Buffers b = {.n = 0};
    Py_ssize_t np1, ns, l3, l4, n, npos, size, size2;
    const int64_t *seg = take(&b, o[0], 'q', 0, &np1, "seg");
    const int32_t *count = seg ? take(&b, o[1], 'i', 0, &ns, "count") : NULL;
    const double *start = count ? take(&b, o[2], 'd', 0, &l3, "start") : NULL;
    const double *gap = start ? take(&b, o[3], 'd', 0, &l4, "gap") : NULL;
    const int64_t *by_rank = gap ? take(&b, o[4], 'q', 0, &n, "by_rank") : NULL;
    const int64_t *offsets = by_rank ? take(&b, o[5], 'q', 0, &npos, "offsets") : NULL;
    double *value = offsets ? take(&b, o[6], 'd', 1, &size, "value") : NULL;
    int64_t *mult = value ? take(&b, o[7], 'q', 1, &size2, "mult") : NULL;
    if (!mult) { release(&b); return NULL; }
    const char *err = l3 != ns || l4 != ns || size2 != size || n + 1 != np1 || npos < 1
        ? "arrays of different lengths" : check_segments(seg, np1, ns);
    if (err) return bad(&b, err);
    for (Py_ssize_t rank = 0; rank < n && !err; rank++) {
        int64_t r = by_rank[rank], p = 0;
        if (r < 0 || r >= n) { err = "a request out of range"; break; }
        for (int64_t s = seg[r]; s < seg[r + 1]; s++) {
            if (s > seg[r]) {
                int64_t slot = p < npos - 1 ? offsets[p] + rank : -1;
                if (slot < 0 || slot >= size) { err = "an entry outside the layout"; break; }
                double tail = gap[s - 1] * (double)((int64_t)count[s - 1] - 1);
                value[slot] = start[s] - (start[s - 1] + tail);
                mult[slot] = 1;
                p++;
            }
            if (count[s] > 1) {
                int64_t slot = p < npos - 1 ? offsets[p] + rank : -1;
                if (slot < 0 || slot >= size) { err = "an entry outside the layout"; break; }
                value[slot] = gap[s];
                mult[slot] = (int64_t)count[s] - 1;
                p++;
            }
        }
    }
    if (err) return bad(&b, err);
    release(&b);
    Py_RETURN_NONE;
}

/* ---- Etalon's deadline walk (pacing.deadline_walk's loop) ------------------------------------- */

/* walk(value, mult, offsets, d, total, missed, slack, width, gather_from): the walk of every position
 * over the ranked lanes (``width`` per request, flat), in place. One entry of ``m`` gaps of ``g`` at
 * deadline D with slack s: over = g - D; j = min(m, floor(s / over)) where over > 0, else m; where
 * j < m a stall: late = floor((g - (s - j over)) / D) + (m - j - 1) floor(g / D), total += j + late,
 * missed += late, s = 0; else total += m, s -= m over. Positions of ``k x width >= gather_from`` lanes
 * are NumPy's gathered ones, whose bulk arithmetic treats a NaN ``j`` as a met entry: kept apart so
 * that even then the two agree. */
static PyObject *walk(PyObject *self, PyObject *args) {
    PyObject *o[7];
    Py_ssize_t width, gather_from;
    if (!PyArg_ParseTuple(args, "OOOOOOOnn", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &width, &gather_from))
        return NULL;
    Buffers b = {.n = 0};
    Py_ssize_t ne, nm, np1, nd, nt, nmi, nsl;
    const double *value = take(&b, o[0], 'd', 0, &ne, "value");
    const int64_t *mult = value ? take(&b, o[1], 'q', 0, &nm, "mult") : NULL;
    const int64_t *offsets = mult ? take(&b, o[2], 'q', 0, &np1, "offsets") : NULL;
    const double *d = offsets ? take(&b, o[3], 'd', 0, &nd, "d") : NULL;
    double *total = d ? take(&b, o[4], 'd', 1, &nt, "total") : NULL;
    double *missed = total ? take(&b, o[5], 'd', 1, &nmi, "missed") : NULL;
    double *slack = missed ? take(&b, o[6], 'd', 1, &nsl, "slack") : NULL;
    if (!slack) { release(&b); return NULL; }
    if (width < 1 || nm != ne || nt != nd || nmi != nd || nsl != nd || np1 < 1 || offsets[0] != 0
        || offsets[np1 - 1] != ne)
        return bad(&b, "arrays of different lengths");
    for (Py_ssize_t p = 0; p + 1 < np1; p++) {
        int64_t a = offsets[p], k = offsets[p + 1] - a;
        if (k < 0 || k * width > nd) return bad(&b, "a position with more entries than requests");
        int gathered = k * width >= gather_from;
        for (int64_t i = 0; i < k; i++) {
            double g = value[a + i];
            int64_t m = mult[a + i];
            double mf = (double)m;
            for (Py_ssize_t l = 0; l < width; l++) {
                Py_ssize_t x = (Py_ssize_t)i * width + l;
                double D = d[x], over = g - D, s = slack[x], j = mf;
                if (over > 0) {
                    double q = floor(s / over);
                    j = isnan(q) ? q : (q < mf ? q : mf);    /* numpy.minimum: NaN wins */
                }
                if (j < mf) {
                    double left = s - j * over;
                    double late = floor((g - left) / D) + ((mf - j) - 1.0) * floor(g / D);
                    total[x] = total[x] + (j + late);
                    missed[x] = missed[x] + late;
                    slack[x] = 0.0;
                } else if (gathered || !isnan(j)) {
                    total[x] = total[x] + mf;
                    slack[x] = s - mf * over;
                } else {                                      /* the quiet positions' arithmetic for a NaN j */
                    total[x] = total[x] + (j + 0.0);
                    slack[x] = s - j * over;
                }
            }
        }
    }
    release(&b);
    Py_RETURN_NONE;
}

/* ---- sorts ------------------------------------------------------------------------------------ */

/* A float64 as an unsigned word of the same order (-0.0 as 0.0, as comparisons see them). */
static inline uint64_t order_key(double v) {
    uint64_t u;
    v += 0.0;
    memcpy(&u, &v, sizeof u);
    return (u >> 63) ? ~u : (u | 0x8000000000000000ULL);
}

#define RADIX_BITS 11
#define RADIX (1 << RADIX_BITS)

/* Stable LSD radix sort of n (key, index) pairs by the ``bits`` low bits of the keys, the keys carried
 * along (no gather of them per pass); digits where all keys agree are skipped. ``key2``/``idx2``: n
 * pairs of scratch. Returns 0, or 1 where the sorted pairs ended in the scratch arrays (the caller
 * swaps), or -1 without memory. */
static int radix_pairs(uint64_t *key, uint32_t *idx, uint64_t *key2, uint32_t *idx2, size_t n, int bits) {
    int passes = (bits + RADIX_BITS - 1) / RADIX_BITS, swapped = 0;
    size_t *hist = calloc((size_t)(passes ? passes : 1) * RADIX, sizeof(size_t));
    if (!hist) return -1;
    for (size_t i = 0; i < n; i++) {
        uint64_t k = key[i];
        for (int p = 0; p < passes; p++) hist[(size_t)p * RADIX + ((k >> (p * RADIX_BITS)) & (RADIX - 1))]++;
    }
    for (int p = 0; p < passes; p++) {
        size_t *h = hist + (size_t)p * RADIX, sum = 0;
        int trivial = 0;
        for (int c = 0; c < RADIX; c++) {
            if (h[c] == n) trivial = 1;
            size_t t = h[c];
            h[c] = sum;
            sum += t;
        }
        if (trivial) continue;
        int shift = p * RADIX_BITS;
        for (size_t i = 0; i < n; i++) {
            uint64_t k = key[i];
            size_t at = h[(k >> shift) & (RADIX - 1)]++;
            key2[at] = k;
            idx2[at] = idx[i];
        }
        uint64_t *tk = key; key = key2; key2 = tk;
        uint32_t *ti = idx; idx = idx2; idx2 = ti;
        swapped ^= 1;
    }
    free(hist);
    return swapped;
}

/* The order of (v, w) pairs by value then weight (numpy.lexsort((w, v))'s), stable: an index array
 * of n, malloc'ed, or NULL (no memory, or a NaN value: then 1 in *nan). Weights must be >= 0;
 * ``w`` NULL: by value alone. */
static uint32_t *pair_order_in(const double *v, const int64_t *w, size_t n, int *nan, uint64_t *room);

static uint32_t *pair_order(const double *v, const int64_t *w, size_t n, int *nan) {
    return pair_order_in(v, w, n, nan, NULL);
}

/* pair_order with its scratch in ``room`` (3n words: the keys, their copy, the two index arrays) where
 * given: the order returned lies in ``room`` (not to be freed) and the keys' words are free again. */
static uint32_t *pair_order_in(const double *v, const int64_t *w, size_t n, int *nan, uint64_t *room) {
    *nan = 0;
    size_t m = n ? n : 1;
    uint64_t *key, *key2;
    uint32_t *idx, *idx2;
    if (room) {
        key = room;
        key2 = room + m;
        idx = (uint32_t *)(room + 2 * m);
        idx2 = idx + m;
    } else {
        key = malloc(m * sizeof(uint64_t));
        key2 = malloc(m * sizeof(uint64_t));
        idx = malloc(m * sizeof(uint32_t));
        idx2 = malloc(m * sizeof(uint32_t));
    }
    uint32_t *out = NULL;
    int ok = key && key2 && idx && idx2;
    for (size_t i = 0; ok && i < n; i++) {
        if (isnan(v[i])) { *nan = 1; ok = 0; }
        idx[i] = (uint32_t)i;
    }
    if (ok && w) {
        int ordered = 1, bits = 0;
        uint64_t top = 0;
        for (size_t i = 0; i < n; i++) {
            key[i] = (uint64_t)w[i];
            top |= key[i];
            if (i && w[i] < w[i - 1]) ordered = 0;
        }
        if (!ordered) {               /* by weight first: the sort by value keeps that order in its ties */
            while (bits < 64 && (top >> bits)) bits++;
            int r = radix_pairs(key, idx, key2, idx2, n, bits);
            if (r < 0) ok = 0;
            else if (r) { uint32_t *t = idx; idx = idx2; idx2 = t; }
        }
    }
    if (ok) {
        for (size_t i = 0; i < n; i++) key[i] = order_key(v[idx[i]]);
        int r = radix_pairs(key, idx, key2, idx2, n, 64);
        if (r < 0) ok = 0;
        else if (r) { uint32_t *t = idx; idx = idx2; idx2 = t; }
    }
    if (ok) { out = idx; idx = NULL; }
    if (!room) {
        free(key);
        free(key2);
        free(idx);
        free(idx2);
    }
    return out;
}

/* pairs_sorted_in(v, w, room) -> bool: pairs_sorted with the sorted pairs written back over (v, w) and the
 * sort's scratch in ``room`` (int64, at least 3 x len(v): memory the caller fills next), no fresh memory;
 * False, with (v, w) as they were, where a value is NaN or a weight negative. */
static PyObject *pairs_sorted_in(PyObject *self, PyObject *args) {
    PyObject *o[3];
    if (!PyArg_ParseTuple(args, "OOO", &o[0], &o[1], &o[2])) return NULL;
    Buffers b = {.n = 0};
    Py_ssize_t n, nw, nr;
    double *v = take(&b, o[0], 'd', 1, &n, "v");
    int64_t *w = v ? take(&b, o[1], 'q', 1, &nw, "w") : NULL;
    uint64_t *room = w ? (uint64_t *)take(&b, o[2], 'q', 1, &nr, "room") : NULL;
    if (!room) { release(&b); return NULL; }
    if (nw != n || nr < 3 * (n ? n : 1) || (uint64_t)n > UINT32_MAX) return bad(&b, "arrays of different lengths");
    for (Py_ssize_t i = 0; i < n; i++)
        if (w[i] < 0) { release(&b); Py_RETURN_FALSE; }
    int nan;
    uint32_t *order = pair_order_in(v, w, (size_t)n, &nan, room);
    if (!order) {
        release(&b);
        if (nan) Py_RETURN_FALSE;
        return PyErr_NoMemory();
    }
    /* the order lies in room's last third, or in the words after its keys': gathered through the
     * first two words of each (the keys', free now), then copied back */
    size_t m = n ? (size_t)n : 1;
    double *gv = (double *)room;
    int64_t *gw = (int64_t *)(room + m);
    for (Py_ssize_t i = 0; i < n; i++) {
        gv[i] = v[order[i]];
        gw[i] = w[order[i]];
    }
    memcpy(v, gv, (size_t)n * sizeof(double));
    memcpy(w, gw, (size_t)n * sizeof(int64_t));
    release(&b);
    Py_RETURN_TRUE;
}

/* pairs_sorted(v, w, out_v, out_w) -> bool: the pairs in numpy.lexsort((w, v))'s order (ties of value
 * by weight), or False where a value is NaN or a weight negative (the caller's NumPy path decides
 * then). For values that are neither 0 nor NaN the same arrays as distribution.pairs_sorted's. */
static PyObject *pairs_sorted(PyObject *self, PyObject *args) {
    PyObject *o[4];
    if (!PyArg_ParseTuple(args, "OOOO", &o[0], &o[1], &o[2], &o[3])) return NULL;
    Buffers b = {.n = 0};
    Py_ssize_t n, nw, n1, n2;
    const double *v = take(&b, o[0], 'd', 0, &n, "v");
    const int64_t *w = v ? take(&b, o[1], 'q', 0, &nw, "w") : NULL;
    double *out_v = w ? take(&b, o[2], 'd', 1, &n1, "out_v") : NULL;
    int64_t *out_w = out_v ? take(&b, o[3], 'q', 1, &n2, "out_w") : NULL;
    if (!out_w) { release(&b); return NULL; }
    if (nw != n || n1 != n || n2 != n || (uint64_t)n > UINT32_MAX) return bad(&b, "arrays of different lengths");
    for (Py_ssize_t i = 0; i < n; i++)
        if (w[i] < 0) { release(&b); Py_RETURN_FALSE; }
    int nan;
    uint32_t *order = pair_order(v, w, (size_t)n, &nan);
    if (!order) {
        release(&b);
        if (nan) Py_RETURN_FALSE;
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        out_v[i] = v[order[i]];
        out_w[i] = w[order[i]];
    }
    free(order);
    release(&b);
    Py_RETURN_TRUE;
}

/* merged(ones, rest_v, rest_w, out_v, cw, prod): the sorted weight-1 values and the sorted pairs of
 * larger weights merged as distribution._merged does (each pair after the values it ties with), with
 * the cumulative weights and each value x weight (the mean's terms, which NumPy then sums). */
static PyObject *merged(PyObject *self, PyObject *args) {
    PyObject *o[6];
    if (!PyArg_ParseTuple(args, "OOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5])) return NULL;
    Buffers b = {.n = 0};
    Py_ssize_t n1, n2, nw, no, nc, np_;
    const double *ones = take(&b, o[0], 'd', 0, &n1, "ones");
    const double *rv = ones ? take(&b, o[1], 'd', 0, &n2, "rest_v") : NULL;
    const int64_t *rw = rv ? take(&b, o[2], 'q', 0, &nw, "rest_w") : NULL;
    double *out_v = rw ? take(&b, o[3], 'd', 1, &no, "out_v") : NULL;
    int64_t *cw = out_v ? take(&b, o[4], 'q', 1, &nc, "cw") : NULL;
    double *prod = cw ? take(&b, o[5], 'd', 1, &np_, "prod") : NULL;
    if (!prod) { release(&b); return NULL; }
    if (nw != n2 || no != n1 + n2 || nc != no || np_ != no) return bad(&b, "arrays of different lengths");
    Py_ssize_t i = 0, j = 0, t = 0;
    int64_t sum = 0;
    while (t < no) {
        double x;
        int64_t w;
        if (j >= n2 || (i < n1 && ones[i] <= rv[j])) { x = ones[i++]; w = 1; }
        else { x = rv[j]; w = rw[j++]; }
        out_v[t] = x;
        sum += w;
        cw[t] = sum;
        prod[t] = x * (double)w;
        t++;
    }
    release(&b);
    Py_RETURN_NONE;
}

/* merged_back(buf, a, rest_v, rest_w, cw): merged's merge where the sorted weight-1 values are buf[:a] and
 * the merge is written over them, into buf[:n] (n = a + len(rest_v) <= len(buf)), from the last entry back
 * (each pair after the values it ties with, as merged: the same arrays), with the cumulative weights into
 * cw[:n]; no array of terms (weigh makes them in place). A write never reaches a value not yet read. */
static PyObject *merged_back(PyObject *self, PyObject *args) {
    PyObject *o[4];
    Py_ssize_t a;
    if (!PyArg_ParseTuple(args, "OnOOO", &o[0], &a, &o[1], &o[2], &o[3])) return NULL;
    Buffers b = {.n = 0};
    Py_ssize_t nb, n2, nw, nc;
    double *buf = take(&b, o[0], 'd', 1, &nb, "buf");
    const double *rv = buf ? take(&b, o[1], 'd', 0, &n2, "rest_v") : NULL;
    const int64_t *rw = rv ? take(&b, o[2], 'q', 0, &nw, "rest_w") : NULL;
    int64_t *cw = rw ? take(&b, o[3], 'q', 1, &nc, "cw") : NULL;
    if (!cw) { release(&b); return NULL; }
    if (a < 0 || nw != n2 || a + n2 > nb || nc < a + n2) return bad(&b, "arrays of different lengths");
    int64_t total = a;
    for (Py_ssize_t j = 0; j < n2; j++) total += rw[j];
    Py_ssize_t i = a - 1, j = n2 - 1;
    for (Py_ssize_t t = a + n2 - 1; t >= 0; t--) {
        double x;
        int64_t w;
        if (j >= 0 && (i < 0 || rv[j] >= buf[i])) { x = rv[j]; w = rw[j--]; }
        else { x = buf[i--]; w = 1; }
        buf[t] = x;
        cw[t] = total;
        total -= w;
    }
    release(&b);
    Py_RETURN_NONE;
}

/* weigh(v, cw, rest_v, rest_w, forward): with forward, each entry of weight other than 1 (its step of cw)
 * becomes value x weight, as merged's terms (weight-1 terms are their values: x * 1.0 is x), for NumPy to
 * sum in place; without, those entries get their values back, rest_v's in order (those of rest_w 1 are
 * the weight-1 values'). */
static PyObject *weigh(PyObject *self, PyObject *args) {
    PyObject *o[4];
    int forward;
    if (!PyArg_ParseTuple(args, "OOOOp", &o[0], &o[1], &o[2], &o[3], &forward)) return NULL;
    Buffers b = {.n = 0};
    Py_ssize_t n, nc, n2, nw;
    double *v = take(&b, o[0], 'd', 1, &n, "v");
    const int64_t *cw = v ? take(&b, o[1], 'q', 0, &nc, "cw") : NULL;
    const double *rv = cw ? take(&b, o[2], 'd', 0, &n2, "rest_v") : NULL;
    const int64_t *rw = rv ? take(&b, o[3], 'q', 0, &nw, "rest_w") : NULL;
    if (!rw) { release(&b); return NULL; }
    if (nc != n || nw != n2) return bad(&b, "arrays of different lengths");
    int64_t before = 0;
    Py_ssize_t j = 0;
    for (Py_ssize_t t = 0; t < n; t++) {
        int64_t w = cw[t] - before;
        before = cw[t];
        if (w == 1) continue;
        if (forward) v[t] = v[t] * (double)w;
        else {
            while (j < n2 && rw[j] == 1) j++;
            if (j >= n2) return bad(&b, "more weighted entries than pairs");
            v[t] = rv[j++];
        }
    }
    release(&b);
    Py_RETURN_NONE;
}

/* A double's bits as an unsigned word that orders as the double does (-0.0 taken as 0.0, which it equals). */
static inline uint64_t ordered_bits(double x) {
    uint64_t u;
    x += 0.0;
    memcpy(&u, &x, sizeof u);
    return (u >> 63) ? ~u : u | (UINT64_C(1) << 63);
}

#define DIGITS 65536   /* 16 bits of the key per round of the selection */

/* slowest_terms(value, mult, k, terms) -> int | None: pacing.slowest_gap_mean's terms. ``threshold``,
 * the k-th largest gap counted with multiplicity, by a selection on the values' bits (16 at a time,
 * weighted by ``mult``: the first round over every entry, then over the entries of the chosen digit);
 * then, in entry order, value x mult of every entry above it, and last threshold x the gaps still to
 * take. Returns how many terms it wrote; None where a value is NaN or a multiplicity below 1 (the
 * NumPy path decides then). ``terms`` holds at least min(k, len(value) + 1) doubles. */
static PyObject *slowest_terms(PyObject *self, PyObject *args) {
    PyObject *o[3];
    long long k;
    if (!PyArg_ParseTuple(args, "OOLO", &o[0], &o[1], &k, &o[2])) return NULL;
    Buffers b = {.n = 0};
    Py_ssize_t ne, nm, nt;
    const double *value = take(&b, o[0], 'd', 0, &ne, "value");
    const int64_t *mult = value ? take(&b, o[1], 'q', 0, &nm, "mult") : NULL;
    double *terms = mult ? take(&b, o[2], 'd', 1, &nt, "terms") : NULL;
    if (!terms) { release(&b); return NULL; }
    if (nm != ne) return bad(&b, "arrays of different lengths");
    if (k < 1 || nt < (k < (long long)ne + 1 ? k : (long long)ne + 1)) return bad(&b, "k out of range or too few terms");
    int64_t *weight = calloc(DIGITS, sizeof(int64_t));
    Py_ssize_t *entries = calloc(DIGITS, sizeof(Py_ssize_t));
    if (!weight || !entries) { free(weight); free(entries); release(&b); return PyErr_NoMemory(); }
    int64_t total = 0;
    for (Py_ssize_t e = 0; e < ne; e++) {
        if (isnan(value[e]) || mult[e] < 1) { free(weight); free(entries); release(&b); Py_RETURN_NONE; }
        unsigned d = (unsigned)(ordered_bits(value[e]) >> 48);
        weight[d] += mult[e];
        entries[d]++;
        total += mult[e];
    }
    if (k > total) { free(weight); free(entries); return bad(&b, "k above the number of gaps"); }
    /* the digit that holds the k-th largest gap: ``above`` gaps lie in the digits over it */
    int64_t above = 0;
    unsigned d = DIGITS - 1;
    while (above + weight[d] < k) above += weight[d--];
    Py_ssize_t nc = entries[d];
    uint64_t *key = malloc((nc ? (size_t)nc : 1) * sizeof(uint64_t));
    int64_t *w = malloc((nc ? (size_t)nc : 1) * sizeof(int64_t));
    if (!key || !w) { free(weight); free(entries); free(key); free(w); release(&b); return PyErr_NoMemory(); }
    for (Py_ssize_t e = 0, c = 0; e < ne; e++) {
        uint64_t u = ordered_bits(value[e]);
        if ((unsigned)(u >> 48) == d) { key[c] = u; w[c++] = mult[e]; }
    }
    uint64_t prefix = (uint64_t)d << 48;
    for (int shift = 32; shift >= 0; shift -= 16) {    /* the next 16 bits, among the entries of the prefix */
        memset(weight, 0, DIGITS * sizeof(int64_t));
        for (Py_ssize_t c = 0; c < nc; c++) weight[(key[c] >> shift) & 0xFFFF] += w[c];
        d = DIGITS - 1;
        while (above + weight[d] < k) above += weight[d--];
        prefix |= (uint64_t)d << shift;
        Py_ssize_t kept = 0;
        for (Py_ssize_t c = 0; c < nc; c++)
            if (((key[c] >> shift) & 0xFFFF) == d) { key[kept] = key[c]; w[kept++] = w[c]; }
        nc = kept;
    }
    free(weight); free(entries); free(key); free(w);
    uint64_t bits = (prefix >> 63) ? prefix & ~(UINT64_C(1) << 63) : ~prefix;
    double threshold;
    memcpy(&threshold, &bits, sizeof threshold);
    Py_ssize_t j = 0;
    int64_t taken = 0;
    for (Py_ssize_t e = 0; e < ne; e++)
        if (value[e] > threshold) {
            terms[j++] = value[e] * (double)mult[e];
            taken += mult[e];
        }
    terms[j++] = threshold * (double)(k - taken);
    release(&b);
    return PyLong_FromSsize_t(j);
}

/* itl_split(seg, start, gap, count, ones, rest_v, rest_w) -> (ones, rest, nan, zero): ITL's gaps
 * (latency.itl_gaps: ``(start - previous start) - previous tail`` between segments of a request, and
 * a segment's count - 1 gaps of ``gap`` > 0) split as distribution.sample_of_parts splits them: the
 * gaps between segments and the segments' own gaps of multiplicity 1 into ``ones`` (their order is
 * the sort's to decide), those of larger multiplicities into ``rest``; how many of each, and how many
 * gaps between segments were NaN (left out, as that split leaves them) or 0 (the caller then goes
 * NumPy's general way). */
static PyObject *itl_split(PyObject *self, PyObject *args) {
    PyObject *o[7];
    if (!PyArg_ParseTuple(args, "OOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6])) return NULL;
    Buffers b = {.n = 0};
    Py_ssize_t np1, ns, l2, l3, n1, n2, n3;
    const int64_t *seg = take(&b, o[0], 'q', 0, &np1, "seg");
    const double *start = seg ? take(&b, o[1], 'd', 0, &ns, "start") : NULL;
    const double *gap = start ? take(&b, o[2], 'd', 0, &l2, "gap") : NULL;
    const int32_t *count = gap ? take(&b, o[3], 'i', 0, &l3, "count") : NULL;
    double *ones = count ? take(&b, o[4], 'd', 1, &n1, "ones") : NULL;
    double *rest_v = ones ? take(&b, o[5], 'd', 1, &n2, "rest_v") : NULL;
    int64_t *rest_w = rest_v ? take(&b, o[6], 'q', 1, &n3, "rest_w") : NULL;
    if (!rest_w) { release(&b); return NULL; }
    const char *err = l2 != ns || l3 != ns || n1 < 2 * ns || n2 < ns || n3 < ns
        ? "arrays of different lengths" : check_segments(seg, np1, ns);
    if (err) return bad(&b, err);
    Py_ssize_t a = 0, r = 0, nan = 0, zero = 0;
    for (Py_ssize_t q = 0; q + 1 < np1; q++) {
        for (int64_t s = seg[q]; s < seg[q + 1]; s++) {
            if (s > seg[q]) {
                double tail = gap[s - 1] * (double)((int64_t)count[s - 1] - 1);
                double x = (start[s] - start[s - 1]) - tail;
                if (isnan(x)) nan++;
                else {
                    zero += x == 0;
                    ones[a++] = x;
                }
            }
            if (count[s] > 1 && gap[s] > 0) {
                if (count[s] == 2) ones[a++] = gap[s];
                else { rest_v[r] = gap[s]; rest_w[r++] = (int64_t)count[s] - 1; }
            }
        }
    }
    release(&b);
    return Py_BuildValue("nnnn", a, r, nan, zero);
}

/* ---- the fairness windows (fairness._windows_of) ----------------------------------------------- */

/* NumPy's float64 -> int64 cast on x86: the integer part; INT64_MIN where NaN or out of range. */
static int64_t np_int64(double x) {
    if (!(x >= -9223372036854775808.0 && x < 9223372036854775808.0)) return INT64_MIN;
    return (int64_t)x;
}

/* fair_service(tn, f, l, n_in, n_out, nwin, w, in_weight, out_weight, svc, jf, jl, many): per row, its first
 * window jf (of its first token f; 0 where it has none) and its last token's jl (0 where it has no output),
 * the input service at its first token plus, for a stream within one window, its output's, added to
 * svc[tn * nwin + jf] in row order (np.bincount's sums); ``many``: the rows whose output spans windows.
 * False, with svc partly filled, where a row's cell is outside svc (the caller's NumPy path decides). */
static PyObject *fair_service(PyObject *self, PyObject *args) {
    PyObject *o[9];
    long long nwin;
    double w, in_weight, out_weight;
    if (!PyArg_ParseTuple(args, "OOOOOLdddOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &nwin, &w, &in_weight,
                          &out_weight, &o[5], &o[6], &o[7], &o[8])) return NULL;
    Buffers b = {.n = 0};
    Py_ssize_t n, l1, l2, l3, l4, cells, l6, l7, l8;
    const int64_t *tn = take(&b, o[0], 'q', 0, &n, "tn");
    const double *f = tn ? take(&b, o[1], 'd', 0, &l1, "f") : NULL;
    const double *l = f ? take(&b, o[2], 'd', 0, &l2, "l") : NULL;
    const double *n_in = l ? take(&b, o[3], 'd', 0, &l3, "n_in") : NULL;
    const double *n_out = n_in ? take(&b, o[4], 'd', 0, &l4, "n_out") : NULL;
    double *svc = n_out ? take(&b, o[5], 'd', 1, &cells, "svc") : NULL;
    int64_t *jf = svc ? take(&b, o[6], 'q', 1, &l6, "jf") : NULL;
    int64_t *jl = jf ? take(&b, o[7], 'q', 1, &l7, "jl") : NULL;
    char *many = jl ? take(&b, o[8], '?', 1, &l8, "many") : NULL;
    if (!many) { release(&b); return NULL; }
    if (l1 < n || l2 < n || l3 < n || l4 < n || l6 < n || l7 < n || l8 < n) return bad(&b, "arrays of different lengths");
    for (Py_ssize_t i = 0; i < n; i++) {
        int started = !isnan(f[i]);
        int64_t a = np_int64(floor(started ? f[i] / w : 0.0));
        int out = n_out[i] > 0 && started;
        int64_t z = np_int64(floor(out ? l[i] / w : 0.0));
        int one = a == z && out;
        double v = (started ? in_weight * n_in[i] : 0.0) + (one ? out_weight * n_out[i] : 0.0);
        int64_t key = (int64_t)((uint64_t)tn[i] * (uint64_t)nwin + (uint64_t)a);
        if (key < 0 || key >= cells) { release(&b); Py_RETURN_FALSE; }
        svc[key] += v;
        jf[i] = a;
        jl[i] = z;
        many[i] = !one && out;
    }
    release(&b);
    Py_RETURN_TRUE;
}

/* np.minimum's and np.maximum's rules: NaN wins (C's fmin and fmax let the other one win). */
static double np_min(double a, double b) { return a <= b || isnan(a) ? a : b; }
static double np_max(double a, double b) { return a >= b || isnan(a) ? a : b; }

/* fair_walk(tn, f, l, n_out, jf, jl, many, nwin, w, out_weight, svc): adds to svc the output service of the
 * rows ``many`` marks, window by window from jf to jl (at least jf), as fairness._walk computes it: the
 * tokens of a stream spaced g = (l - f) / (n_out - 1) that fall in window j, from ceil((j w - f) / g) to
 * ceil(((j + 1) w - f) / g) - 1, clipped to the stream. Every service is whole tokens (or not finite), so
 * adding row by row gives _walk's sums. False, with svc partly filled, where a cell is outside svc. */
static PyObject *fair_walk(PyObject *self, PyObject *args) {
    PyObject *o[8];
    long long nwin;
    double w, out_weight;
    if (!PyArg_ParseTuple(args, "OOOOOOOLddO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &nwin, &w,
                          &out_weight, &o[7])) return NULL;
    Buffers b = {.n = 0};
    Py_ssize_t n, l1, l2, l3, l4, l5, l6, cells;
    const int64_t *tn = take(&b, o[0], 'q', 0, &n, "tn");
    const double *f = tn ? take(&b, o[1], 'd', 0, &l1, "f") : NULL;
    const double *l = f ? take(&b, o[2], 'd', 0, &l2, "l") : NULL;
    const double *n_out = l ? take(&b, o[3], 'd', 0, &l3, "n_out") : NULL;
    const int64_t *jf = n_out ? take(&b, o[4], 'q', 0, &l4, "jf") : NULL;
    const int64_t *jl = jf ? take(&b, o[5], 'q', 0, &l5, "jl") : NULL;
    const char *many = jl ? take(&b, o[6], '?', 0, &l6, "many") : NULL;
    double *svc = many ? take(&b, o[7], 'd', 1, &cells, "svc") : NULL;
    if (!svc) { release(&b); return NULL; }
    if (l1 < n || l2 < n || l3 < n || l4 < n || l5 < n || l6 < n) return bad(&b, "arrays of different lengths");
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!many[i]) continue;
        double ff = f[i], nn1 = n_out[i] - 1;
        double g = (l[i] - ff) / nn1;
        int64_t j = jf[i], jend = jl[i];
        int64_t base = (int64_t)((uint64_t)tn[i] * (uint64_t)nwin);
        double starts = ceil(((double)j * w - ff) / g);
        for (;;) {
            double ends = ceil(((double)(int64_t)((uint64_t)j + 1u) * w - ff) / g);
            double k = np_max(0.0, (np_min(nn1, ends - 1.0) - np_max(0.0, starts)) + 1.0) * out_weight;
            int64_t at = (int64_t)((uint64_t)base + (uint64_t)j);
            if (at < 0 || at >= cells) { release(&b); Py_RETURN_FALSE; }
            svc[at] += k;
            if (!(j < jend)) break;
            starts = ends;
            j++;
        }
    }
    release(&b);
    Py_RETURN_TRUE;
}

/* fair_backlog(tn, s, f, l, nwin, w, backlog): marks each cell (tenant x window) in which some row waited:
 * from its origin s to its first token f, or where it has none, to the later of its last token and s; a
 * row that did not wait marks the spare cell past the last. False where a cell is outside ``backlog``. */
static PyObject *fair_backlog(PyObject *self, PyObject *args) {
    PyObject *o[5];
    long long nwin;
    double w;
    if (!PyArg_ParseTuple(args, "OOOOLdO", &o[0], &o[1], &o[2], &o[3], &nwin, &w, &o[4])) return NULL;
    Buffers b = {.n = 0};
    Py_ssize_t n, l1, l2, l3, size;
    const int64_t *tn = take(&b, o[0], 'q', 0, &n, "tn");
    const double *s = tn ? take(&b, o[1], 'd', 0, &l1, "s") : NULL;
    const double *f = s ? take(&b, o[2], 'd', 0, &l2, "f") : NULL;
    const double *l = f ? take(&b, o[3], 'd', 0, &l3, "l") : NULL;
    char *backlog = l ? take(&b, o[4], '?', 1, &size, "backlog") : NULL;
    if (!backlog) { release(&b); return NULL; }
    if (l1 < n || l2 < n || l3 < n || size < 1) return bad(&b, "arrays of different lengths");
    int64_t cells = size - 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* np.fmax's rule (the first where it is not below the second or the second is NaN) */
        double x = !isnan(f[i]) ? f[i] : l[i] >= s[i] || isnan(s[i]) ? l[i] : s[i];
        int waits = x > s[i];
        int64_t last = (int64_t)((uint64_t)np_int64(ceil((waits ? x : 0.0) / w)) - 1u);
        int64_t first = np_int64(floor(waits ? s[i] / w : 0.0));
        int64_t base = (int64_t)((uint64_t)tn[i] * (uint64_t)nwin);
        int64_t key = waits ? (int64_t)((uint64_t)base + (uint64_t)first) : cells;
        if (key < 0 || key > cells) { release(&b); Py_RETURN_FALSE; }
        backlog[key] = 1;
        for (int64_t j = first + 1; first < last && j <= last; j++) {
            int64_t at = (int64_t)((uint64_t)base + (uint64_t)j);
            if (at < 0 || at > cells) { release(&b); Py_RETURN_FALSE; }
            backlog[at] = 1;
        }
    }
    release(&b);
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"entry_counts", entry_counts, METH_VARARGS, "Each request's number of stream entries."},
    {"layout", layout, METH_VARARGS, "The streams' entries scattered to their slots."},
    {"walk", walk, METH_VARARGS, "Etalon's deadline walk over the laid-out streams, in place."},
    {"pairs_sorted", pairs_sorted, METH_VARARGS, "(v, w) pairs in lexsort((w, v)) order; False on NaN."},
    {"pairs_sorted_in", pairs_sorted_in, METH_VARARGS, "pairs_sorted written back over (v, w), its scratch lent."},
    {"merged", merged, METH_VARARGS, "Sorted weight-1 values and sorted pairs merged, with cw and terms."},
    {"merged_back", merged_back, METH_VARARGS, "merged's merge written over the sorted weight-1 values, with cw."},
    {"weigh", weigh, METH_VARARGS, "The merged entries of weight other than 1 times their weights, or back."},
    {"fair_service", fair_service, METH_VARARGS, "Each row's first and last window and its service to its first cell."},
    {"fair_walk", fair_walk, METH_VARARGS, "The output service of the streams over several windows, window by window."},
    {"fair_backlog", fair_backlog, METH_VARARGS, "The cells (tenant x window) in which some row waited."},
    {"itl_split", itl_split, METH_VARARGS, "ITL's gaps split into weight-1 values and pairs of larger weights."},
    {"slowest_terms", slowest_terms, METH_VARARGS, "The slowest-10% mean's terms; None on NaN."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "report_kernels", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_report_kernels(void) { return PyModule_Create(&module); }
