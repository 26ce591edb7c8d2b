/* The prefix-cache accounting's passes in C (llmlb_bench/metrics/cache_accounting.py has the NumPy
 * reference of each; tests/test_cache_accounting.py runs both and compares them):
 * - parts: each block's part (the top bits of its spread hash) and how many blocks each part has;
 * - spill and select: a group of parts' blocks and their hashes by part (a counting sort in one pass over
 *   their parts), then a part's blocks' spread hashes and sort keys (what _parts and _keys do in NumPy
 *   passes: a comparison and a nonzero scan per part, gathers and per-row counts);
 * - piece: the pass over a piece of sorted keys (_account_piece), in one pass per hash.
 * Same integer operations (64-bit, wrapping as NumPy's), so that the results are the NumPy path's exactly.
 *
 * Built by setup.py beside the compiled simulator core (compiled_core.KERNELS) and loaded only while
 * the core is; without it the NumPy code runs. Arrays come through the buffer protocol (NumPy arrays,
 * C-contiguous, int64: the keys as their int64 view; the per-slot figures side by side). No NumPy headers: the build needs only Python's.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "kernel_buffers.h"

/* wrapping 64-bit arithmetic, as NumPy's int64 */
static inline int64_t add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static inline int64_t sub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
static inline int64_t mul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }

/* 2^64 / golden ratio: cache_accounting._SPREAD */
#define SPREAD 0x9E3779B97F4A7C15ull

/* parts(values, bits, part, counts): part[i] = the top ``bits`` (1-16) of the spread hash of values[i],
 * as uint8 (bits <= 8) or uint16; counts[p] (2^bits int64, zeroed here) how many items are in part p. */
static PyObject *parts(PyObject *self, PyObject *args) {
    PyObject *o[3];
    int bits;
    if (!PyArg_ParseTuple(args, "OiOO", &o[0], &bits, &o[1], &o[2])) return NULL;
    if (bits < 1 || bits > 16) { PyErr_SetString(PyExc_ValueError, "bad part bits"); return NULL; }
    Buffers b = {.n = 0};
    Py_ssize_t nv, np_, nc;
    const uint64_t *values = take(&b, o[0], 'Q', 0, &nv, "values");
    void *part = values ? take(&b, o[1], bits <= 8 ? 'B' : 'H', 1, &np_, "part") : NULL;
    int64_t *counts = part ? take(&b, o[2], 'q', 1, &nc, "counts") : NULL;
    if (!counts) { release(&b); return NULL; }
    if (np_ != nv || nc != (Py_ssize_t)1 << bits) return bad(&b, "arrays of different lengths");
    memset(counts, 0, sizeof(int64_t) * (size_t)nc);
    const int shift = 64 - bits;
    for (Py_ssize_t i = 0; i < nv; i++) {
        uint64_t p = (values[i] * SPREAD) >> shift;
        if (bits <= 8) ((uint8_t *)part)[i] = (uint8_t)p;
        else ((uint16_t *)part)[i] = (uint16_t)p;
        counts[p]++;
    }
    release(&b);
    Py_RETURN_NONE;
}

/* the lowest set bit's place (mask not 0) */
static inline int lowest_bit(uint64_t mask) {
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_ctzll(mask);
#else
    int at = 0;
    while (!(mask & 1)) { mask >>= 1; at++; }
    return at;
#endif
}

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(address) __builtin_prefetch(address)
#else
#define PREFETCH(address) ((void)(address))
#endif

/* The items of ``part`` (``n`` of them, uint8) among the 64 from ``at`` whose part is ``k0`` to
 * ``k0 + g - 1``, as bits. */
static inline uint64_t matches64(const uint8_t *part, Py_ssize_t at, Py_ssize_t n, int k0, int g) {
    uint64_t mask = 0;
    Py_ssize_t m = n - at < 64 ? n - at : 64;
#ifdef __SSE2__
    if (m == 64) {
        const __m128i low = _mm_set1_epi8((char)k0), top = _mm_set1_epi8((char)(g - 1));
        for (int q = 0; q < 4; q++) {
            /* (part - k0) as a byte, wrapping: in the group where at most g - 1 */
            __m128i x = _mm_sub_epi8(_mm_loadu_si128((const __m128i *)(part + at + 16 * q)), low);
            __m128i in = _mm_cmpeq_epi8(_mm_min_epu8(x, top), x);
            mask |= (uint64_t)(uint16_t)_mm_movemask_epi8(in) << (16 * q);
        }
        return mask;
    }
#endif
    for (Py_ssize_t j = 0; j < m; j++) mask |= (uint64_t)((uint8_t)(part[at + j] - k0) < g) << j;
    return mask;
}

/* spill(part, values, k0, starts, index, hashes): the items of parts k0 to k0 + len(starts) - 2, in one
 * pass over ``part`` (uint8 or uint16, as parts() wrote it), written by part into ``index`` (uint32: the
 * items' places) and ``hashes`` (uint64: their ``values``), part k0 + j's at starts[j] to starts[j + 1] in
 * ascending order: a counting sort, whose counts parts() gave. A group of parts read in one pass: a pass
 * per part read every part's bytes once for each (a million requests: 64 passes over 153 MB). The
 * values go with the places: read in order here (a group's items are several in every cache line), where
 * select() read a part's through its places, a cache line per item. */
static PyObject *spill(PyObject *self, PyObject *args) {
    PyObject *o[5];
    int k0, wide;
    if (!PyArg_ParseTuple(args, "OOiOOOp", &o[0], &o[1], &k0, &o[2], &o[3], &o[4], &wide)) return NULL;
    Buffers b = {.n = 0};
    Py_ssize_t items, nv, ns, ni, nh;
    const void *part = take(&b, o[0], wide ? 'H' : 'B', 0, &items, "part");
    const uint64_t *values = part ? take(&b, o[1], 'Q', 0, &nv, "values") : NULL;
    const int64_t *starts = values ? take(&b, o[2], 'q', 0, &ns, "starts") : NULL;
    uint32_t *index = starts ? take(&b, o[3], 'I', 1, &ni, "index") : NULL;
    uint64_t *hashes = index ? take(&b, o[4], 'Q', 1, &nh, "hashes") : NULL;
    if (!hashes) { release(&b); return NULL; }
    if (nv != items || nh != ni) return bad(&b, "arrays of different lengths");
    int g = (int)ns - 1;
    if (g < 1 || g > 256 || k0 < 0 || k0 + g > (wide ? 1 << 16 : 1 << 8) || items > (Py_ssize_t)UINT32_MAX)
        return bad(&b, "bad part group");
    if (starts[0] != 0 || starts[g] != ni) return bad(&b, "bad part starts");
    Py_ssize_t at[256], end[256];
    for (int j = 0; j < g; j++) {
        if (starts[j + 1] < starts[j]) return bad(&b, "bad part starts");
        at[j] = starts[j];
        end[j] = starts[j + 1];
    }
#define PUT(i, p)                                                                        \
    do {                                                                                 \
        int p_ = (p);                                                                    \
        if (at[p_] == end[p_]) return bad(&b, "more items in a part than its count");     \
        hashes[at[p_]] = values[i];                                                      \
        index[at[p_]++] = (uint32_t)(i);                                                 \
    } while (0)
    if (!wide) {
        const uint8_t *bytes = part;
        for (Py_ssize_t q = 0; q < items; q += 64)
            for (uint64_t mask = matches64(bytes, q, items, k0, g); mask; mask &= mask - 1) {
                Py_ssize_t i = q + lowest_bit(mask);
                PUT(i, bytes[i] - k0);
            }
    } else {
        const uint16_t *words = part;
        for (Py_ssize_t i = 0; i < items; i++)
            if (words[i] >= k0 && words[i] < k0 + g) PUT(i, words[i] - k0);
    }
#undef PUT
    for (int j = 0; j < g; j++)
        if (at[j] != end[j]) return bad(&b, "fewer items in a part than its count");
    release(&b);
    Py_RETURN_NONE;
}

/* select()'s table of spread hashes met lately: 2^SEEN_BITS words (512 KB: in a core's second-level
 * cache) */
#define SEEN_BITS 16

/* select(index, hashes, offsets, base, bits, low_bits, spread, key) -> how many spreads written: the
 * items ``index`` (uint32, ascending; None: every item), whose values are ``hashes`` (one per item listed,
 * as spill() wrote them), each written as its sort key: its spread hash less the top ``bits`` (those that
 * name its part) above ``low_bits``, below them its name, ``base[r] + i`` for item i of row r (rows:
 * ``offsets``, 0 to the items; the items are read in order, the rows walked along). Into ``spread``
 * (unless None), from its start, each distinct one of the items' spread hashes less those bits, some
 * more than once: one met lately (the last with its table entry) is not written again. The spreads feed
 * only the check for distinct hashes sharing a key's bits, which needs each once; most of a run's blocks
 * repeat a hash (a million requests of the shared-prefix workload: 153 million prompt blocks, 25 million
 * spreads written, 20 million distinct), so its sort reads a sixth of them. */
static PyObject *select_part(PyObject *self, PyObject *args) {
    PyObject *o[6];
    int bits, low_bits;
    if (!PyArg_ParseTuple(args, "OOOOiiOO", &o[0], &o[1], &o[2], &o[3], &bits, &low_bits, &o[4], &o[5]))
        return NULL;
    if (bits < 0 || bits > 16 || low_bits < 1 || low_bits > 63) {
        PyErr_SetString(PyExc_ValueError, "bad key layout");
        return NULL;
    }
    Buffers b = {.n = 0};
    Py_ssize_t ni = 0, nh, no, nb, ns = 0, nk;
    const uint32_t *index = NULL;
    int ok = 1;
    if (o[0] != Py_None) ok = (index = take(&b, o[0], 'I', 0, &ni, "index")) != NULL;
    const uint64_t *hashes = ok ? take(&b, o[1], 'Q', 0, &nh, "hashes") : NULL;
    const int64_t *offsets = hashes ? take(&b, o[2], 'q', 0, &no, "offsets") : NULL;
    const int64_t *base = offsets ? take(&b, o[3], 'q', 0, &nb, "base") : NULL;
    uint64_t *spread = NULL;
    if (base && o[4] != Py_None && !(spread = take(&b, o[4], 'Q', 1, &ns, "spread"))) base = NULL;
    uint64_t *key = base ? take(&b, o[5], 'Q', 1, &nk, "key") : NULL;
    if (!key) { release(&b); return NULL; }
    Py_ssize_t rows = no - 1;
    if (rows < 0 || nb != rows) return bad(&b, "arrays of different lengths");
    Py_ssize_t items = offsets[rows], n = index ? ni : items;
    if (nh != n || nk != n || (spread && ns != nk)) return bad(&b, "arrays of different lengths");
    if (offsets[0] != 0) return bad(&b, "bad row offsets");
    for (Py_ssize_t r = 0; r < rows; r++)
        if (offsets[r + 1] < offsets[r]) return bad(&b, "bad row offsets");
    for (Py_ssize_t j = 0; j < ni; j++)
        if (index[j] >= items || (j && index[j] <= index[j - 1])) return bad(&b, "bad item index");
    const uint64_t high = ~(((uint64_t)1 << low_bits) - 1);
    /* the hashes met lately, by their spread's top bits: a repeat of one is not written to ``spread`` */
    static uint64_t seen[1 << SEEN_BITS];
    if (spread) memset(seen, 0, sizeof seen);
    Py_ssize_t r = 0, written = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_ssize_t i = index ? (Py_ssize_t)index[j] : j;
        while (offsets[r + 1] <= i) r++;                    /* the items come in order */
        uint64_t spreaded = (hashes[j] * SPREAD) << bits;
        if (spread) spread[j] = spreaded;
        key[j] = (spreaded & high) | (uint64_t)(base[r] + i);
    }
    /* the repeats left out in a pass of its own (done in the pass above, the table's lines lost their
     * place in the cache) */
    for (Py_ssize_t j = 0; spread && j < n; j++) {
        uint64_t now = spread[j], *met = &seen[now >> (64 - SEEN_BITS)];
        spread[written] = now;
        written += *met != now || !now;                 /* 0 is also an empty entry's: always written */
        *met = now;
    }
    release(&b);
    return PyLong_FromSsize_t(written);
}

/* how many sorted blocks ahead piece() asks for a block's per-slot figures */
#define AHEAD_SLOTS 16

/* piece(key, splits, table, low_bits, pos_bits, levels, stride, renumber, targets): lowers ``lowest``
 * (per slot and level) by a piece of sorted keys (_account_piece's docstring has the walk). ``table``
 * holds eight words per slot, one cache line where it is aligned (a block reads one line, whose slot
 * is asked for ahead: at a million requests the table is 64 MB): give, ready_needs, reach_needs,
 * arrival, then ``lowest`` at each level. A hash starts at the first key, where the key bits change and at each of
 * ``splits`` (ascending); its number is the key bits (``renumber`` 0) or its count in the piece from
 * 1, times ``stride`` where there are targets. */
static PyObject *piece(PyObject *self, PyObject *args) {
    PyObject *o[3];
    int low_bits, pos_bits, levels, renumber, targets;
    long long stride;
    if (!PyArg_ParseTuple(args, "OOOiiiLii", &o[0], &o[1], &o[2], &low_bits, &pos_bits, &levels, &stride,
                          &renumber, &targets))
        return NULL;
    Buffers b = {.n = 0};
    Py_ssize_t size, ns, nt;
    const int64_t *key = take(&b, o[0], 'q', 0, &size, "key");
    const int64_t *splits = key ? take(&b, o[1], 'q', 0, &ns, "splits") : NULL;
    int64_t *table = splits ? take(&b, o[2], 'q', 1, &nt, "table") : NULL;
/* figure j of a slot's, and its first position at a level */
#define T(slot, j) table[8 * (slot) + (j)]
#define LOWEST(slot, level) table[8 * (slot) + 4 + (level)]
    if (!table) { release(&b); return NULL; }
    if (low_bits < 1 || low_bits > 63 || pos_bits < 1 || pos_bits >= low_bits || levels < 1 ||
        (targets && levels != 3) || (!targets && levels != 1))
        return bad(&b, "bad key layout");
    Py_ssize_t slots = nt / 8;
    if (nt != slots * 8) return bad(&b, "a table of eight words per slot expected");
    const uint64_t lowmask = ((uint64_t)1 << low_bits) - 1, posmask = ((uint64_t)1 << pos_bits) - 1;
    for (Py_ssize_t i = 0; i < size; i++)   /* every name's slot in range: checked once, before any write */
        if ((Py_ssize_t)(((uint64_t)key[i] & lowmask) >> pos_bits) >= slots) return bad(&b, "a key names no slot");
    for (Py_ssize_t j = 0; j < ns; j++)
        if (splits[j] < 0 || splits[j] >= size || (j && splits[j] <= splits[j - 1])) return bad(&b, "bad splits");
    /* the misses of one hash: a buffer kept between calls (a fresh one per call cost a page fault per
     * 4 KB); the GIL is held throughout */
    static int64_t *miss = NULL;
    static Py_ssize_t room = 0;
    if (room < size + 1) {
        int64_t *grown = realloc(miss, sizeof(int64_t) * (size_t)(size + 1));
        if (!grown) { release(&b); return PyErr_NoMemory(); }
        miss = grown;
        room = size + 1;
    }
    int64_t run = 0, count = 0;
    Py_ssize_t sp = 0, i = 0;
    while (i < size) {
        /* the hash starting at i: up to the next change of the key bits or split */
        uint64_t field = (uint64_t)key[i] >> low_bits;
        if (sp < ns && splits[sp] == i) sp++;
        Py_ssize_t e = i + 1;
        Py_ssize_t next_split = sp < ns ? (Py_ssize_t)splits[sp] : size;
        while (e < size && e < next_split && ((uint64_t)key[e] >> low_bits) == field) e++;
        count++;
        int64_t number = renumber ? count : (int64_t)field;
        int64_t first = INT64_MAX;
        Py_ssize_t m = 0;
        if (!targets) {
            for (Py_ssize_t k = i; k < e; k++) {
                int64_t a = T(((uint64_t)key[k] & lowmask) >> pos_bits, 3);
                if (a < first) first = a;
            }
            for (Py_ssize_t k = i; k < e; k++) {
                uint64_t name = (uint64_t)key[k] & lowmask;
                Py_ssize_t slot = (Py_ssize_t)(name >> pos_bits);
                int64_t pos = (int64_t)(name & posmask);
                int64_t low = LOWEST(slot, 0);
                LOWEST(slot, 0) = T(slot, 3) == first && pos < low ? pos : low;
            }
        } else if (e == i + 1) {
            /* a hash of one block (most of a run's: a request's own blocks): it has no earlier member,
             * so it is below every level where it stands (the walk below says the same, without the
             * list of misses and its loops' branches) */
            if (i + AHEAD_SLOTS < size)
                PREFETCH(table + 8 * (((uint64_t)key[i + AHEAD_SLOTS] & lowmask) >> pos_bits));
            uint64_t name = (uint64_t)key[i] & lowmask;
            Py_ssize_t slot = (Py_ssize_t)(name >> pos_bits);
            int64_t pos = (int64_t)(name & posmask);
            int64_t r = add(T(slot, 0), mul(number, (int64_t)stride));
            if (!i || r > run) run = r;
            if (pos < LOWEST(slot, 0)) LOWEST(slot, 0) = pos;
        } else {
            number = mul(number, (int64_t)stride);
            for (Py_ssize_t k = i; k < e; k++) {
                /* a later block's slot asked for now: the slots of a hash's blocks are far apart */
                if (k + AHEAD_SLOTS < size) {
                    Py_ssize_t later = (Py_ssize_t)(((uint64_t)key[k + AHEAD_SLOTS] & lowmask) >> pos_bits);
                    PREFETCH(table + 8 * later);
                }
                Py_ssize_t slot = (Py_ssize_t)(((uint64_t)key[k] & lowmask) >> pos_bits);
                int64_t before = k ? sub(run, number) : -((int64_t)1 << 62);
                int64_t r = add(T(slot, 0), number);
                if (!k || r > run) run = r;
                if (T(slot, 1) >= before) {
                    miss[m++] = (int64_t)((uint64_t)k << 1 | (uint64_t)(T(slot, 2) < before));
                    if (T(slot, 3) < first) first = T(slot, 3);
                }
            }
            for (Py_ssize_t q = 0; q < m; q++) {
                uint64_t name = (uint64_t)key[miss[q] >> 1] & lowmask;
                Py_ssize_t slot = (Py_ssize_t)(name >> pos_bits);
                int64_t pos = (int64_t)(name & posmask);
                int64_t *at = &LOWEST(slot, (miss[q] & 1) + (T(slot, 3) != first));
                *at = pos < *at ? pos : *at;
            }
        }
        i = e;
    }
#undef T
#undef LOWEST
    release(&b);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"parts", parts, METH_VARARGS, "Each block's part and the parts' sizes."},
    {"spill", spill, METH_VARARGS, "A group of parts' items, by part."},
    {"select", select_part, METH_VARARGS, "A part's blocks' spread hashes and sort keys, in order."},
    {"piece", piece, METH_VARARGS, "Lower the leading counts by a piece of sorted keys, in place."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cache_kernels", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_cache_kernels(void) { return PyModule_Create(&module); }
