/*
 * tidelog._crc32c: CRC-32C (Castagnoli) of many byte ranges of one buffer in one call.
 *
 * What it is. tidelog stores one CRC-32C per record, over the record's bytes [4, size)
 * (docs/format.md). Every read checks every record and every append computes every record's
 * checksum; done one Python call per record, the call cost most of the time. The two functions
 * here take a whole batch: the buffer, and the records' ranges as int64 arrays (any object with
 * the buffer protocol; numpy arrays in tidelog), and make no Python object per record.
 *
 *   crc32c_ranges(data, starts, ends, out, *, portable=False)
 *       out[i] = CRC-32C of data[starts[i]:ends[i]] for every i.
 *   stamp_record_crcs(data, positions, sizes, *, portable=False)
 *       for every record i at data[positions[i] : positions[i] + sizes[i]], writes the CRC-32C
 *       of its bytes [4, size) into its bytes [0, 4), little-endian (the record format's CRC
 *       field), in place.
 *   check_records(data, positions, sizes, offsets, timestamps, *, portable=False)
 *       -> (kind, i): a read's whole check in one pass. (1, i): entry i lies outside data or is
 *       shorter than a record header (every entry is checked before any CRC); (2, i): record i
 *       is the first whose CRC-32C over its bytes [4, size) differs from its CRC field, or whose
 *       size, offset or timestamp field differs from its index entry (sizes, offsets,
 *       timestamps; offsets and timestamps may be strided, fields of the index's records);
 *       (0, -1): every record agrees.
 *   hardware() -> bool
 *       whether the SSE4.2 crc32 instruction is used (portable=False).
 *
 * Invariants. The result is the standard CRC-32C (reflected polynomial 0x82F63B78, initial value
 * and final xor 0xFFFFFFFF), the one the crc32c package computes, on either path. Nothing is read
 * or written outside the buffers: the arrays must be one-dimensional and C-contiguous with the
 * right item type (int64 ranges, uint32 out), of equal lengths, and every range is checked against
 * the buffer just before it is read (ValueError names the first bad one; the results before it
 * are already written). The int64 arrays are read once per element, into locals, so an array
 * changed by another thread while the GIL is released can only give a wrong result or the error,
 * never a read outside the buffer.
 *
 * Theory of operation. On x86-64 CPUs with SSE4.2 (checked once at import,
 * __builtin_cpu_supports) the crc32 instruction consumes eight bytes per step; the function
 * is compiled for SSE4.2 alone (a target attribute), so the module itself runs on any x86-64.
 * Elsewhere, and when portable=True (the tests compare both), a table-driven slicing-by-8 pass:
 * eight 256-entry tables, eight bytes per step, loaded byte by byte so it is endian-neutral.
 * Passes over 64 KiB or more of buffer release the GIL; the buffers stay exported (Py_buffer)
 * until the pass ends, so they cannot be resized or freed under it.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TIDELOG_X86 1
#include <nmmintrin.h>
#endif

#define POLYNOMIAL 0x82F63B78u

/* One read of an int64 array element that another thread may change while the GIL is released:
 * a relaxed atomic load, so the compiler reads it exactly once (the value is then checked). */
#if defined(__GNUC__) || defined(__clang__)
#define LOAD_ONCE(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#else
#define LOAD_ONCE(p) (*(volatile const int64_t *)(p))
#endif
#define RELEASE_GIL_BYTES 65536

typedef uint32_t (*crc_fn)(uint32_t, const uint8_t *, size_t);

static uint32_t table[8][256];

static void build_tables(void) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ POLYNOMIAL : c >> 1;
        }
        table[0][b] = c;
    }
    for (int t = 1; t < 8; t++) {
        for (uint32_t b = 0; b < 256; b++) {
            uint32_t previous = table[t - 1][b];
            table[t][b] = (previous >> 8) ^ table[0][previous & 0xFF];
        }
    }
}

/* Continues the register (the CRC before its final inversion) over n bytes: slicing-by-8. */
static uint32_t update_portable(uint32_t crc, const uint8_t *p, size_t n) {
    while (n >= 8) {
        uint32_t low = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                              (uint32_t)p[3] << 24);
        crc = table[7][low & 0xFF] ^ table[6][(low >> 8) & 0xFF] ^ table[5][(low >> 16) & 0xFF] ^
              table[4][low >> 24] ^ table[3][p[4]] ^ table[2][p[5]] ^ table[1][p[6]] ^
              table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--) {
        crc = table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    }
    return crc;
}

#ifdef TIDELOG_X86
/* The same with the SSE4.2 crc32 instruction, eight bytes per step. */
__attribute__((target("sse4.2"))) static uint32_t update_sse42(uint32_t crc, const uint8_t *p,
                                                               size_t n) {
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    if (n >= 4) {
        uint32_t word;
        memcpy(&word, p, 4);
        c32 = _mm_crc32_u32(c32, word);
        p += 4;
        n -= 4;
    }
    while (n--) {
        c32 = _mm_crc32_u8(c32, *p++);
    }
    return c32;
}

/* Three CRCs at once: the crc32 instruction takes three cycles to give its result but can
 * start one every cycle, so one record's pass waits on itself; three independent passes in step
 * keep it busy (records are small: ~130 bytes is ~17 dependent steps). Each of crc[k] is updated
 * over p[k][0, n[k]): in step over the bytes all three have, then each alone. */
__attribute__((target("sse4.2"))) static void update3_sse42(uint32_t crc[3],
                                                             const uint8_t *const p[3],
                                                             const size_t n[3]) {
    size_t common = n[0] < n[1] ? n[0] : n[1];
    common = (common < n[2] ? common : n[2]) & ~(size_t)7;
    uint64_t c0 = crc[0], c1 = crc[1], c2 = crc[2];
    for (size_t at = 0; at < common; at += 8) {
        uint64_t w0, w1, w2;
        memcpy(&w0, p[0] + at, 8);
        memcpy(&w1, p[1] + at, 8);
        memcpy(&w2, p[2] + at, 8);
        c0 = _mm_crc32_u64(c0, w0);
        c1 = _mm_crc32_u64(c1, w1);
        c2 = _mm_crc32_u64(c2, w2);
    }
    crc[0] = update_sse42((uint32_t)c0, p[0] + common, n[0] - common);
    crc[1] = update_sse42((uint32_t)c1, p[1] + common, n[1] - common);
    crc[2] = update_sse42((uint32_t)c2, p[2] + common, n[2] - common);
}
#endif

static crc_fn hardware_update = NULL; /* set at import when the CPU has the instruction */

static crc_fn chosen(int portable) {
    return (portable || hardware_update == NULL) ? update_portable : hardware_update;
}

/* update3 for the chosen pass: three in step on the hardware path, one after another else. */
static void update3(int portable, uint32_t crc[3], const uint8_t *const p[3], const size_t n[3]) {
#ifdef TIDELOG_X86
    if (!portable && hardware_update != NULL) {
        update3_sse42(crc, p, n);
        return;
    }
#endif
    crc_fn update = chosen(portable);
    for (int k = 0; k < 3; k++) {
        crc[k] = update(crc[k], p[k], n[k]);
    }
}

/* The CRC-32C of each of `count` (1 to 3) ranges of `bytes`: [from[k], from[k] + length[k]),
 * already checked to lie inside the buffer; three in step when there are three. */
static void crc_group(int portable, const uint8_t *bytes, const int64_t from[3],
                      const int64_t length[3], int count, uint32_t out[3]) {
    uint32_t crc[3] = {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu};
    if (count == 3) {
        const uint8_t *const start[3] = {bytes + from[0], bytes + from[1], bytes + from[2]};
        const size_t span[3] = {(size_t)length[0], (size_t)length[1], (size_t)length[2]};
        update3(portable, crc, start, span);
    } else {
        crc_fn update = chosen(portable);
        for (int k = 0; k < count; k++) {
            crc[k] = update(crc[k], bytes + from[k], (size_t)length[k]);
        }
    }
    for (int k = 0; k < count; k++) {
        out[k] = ~crc[k];
    }
}

/* A one-dimensional C-contiguous array of `itemsize`-byte items whose struct format is one of
 * `codes` (an optional byte-order prefix for the native order allowed). */
static int get_array(PyObject *obj, Py_buffer *view, int flags, Py_ssize_t itemsize,
                     const char *codes, const char *what, const char *name) {
    if (PyObject_GetBuffer(obj, view, flags | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return -1;
    }
    const char *format = view->format ? view->format : "B";
    if (*format == '@' || *format == '=' || (PY_LITTLE_ENDIAN && *format == '<') ||
        (!PY_LITTLE_ENDIAN && *format == '>')) {
        format++;
    }
    if (view->ndim != 1 || view->itemsize != itemsize || format[0] == '\0' ||
        format[1] != '\0' || strchr(codes, format[0]) == NULL) {
        PyErr_Format(PyExc_TypeError,
                     "%s must be a one-dimensional contiguous array of %s, not one of format '%s' "
                     "with %zd dimension(s) and %zd-byte items",
                     name, what, view->format ? view->format : "B", (Py_ssize_t)view->ndim,
                     view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Both int64 arrays, of one length. */
static int get_pair(PyObject *first, PyObject *second, Py_buffer *a, Py_buffer *b,
                    const char *first_name, const char *second_name) {
    if (get_array(first, a, PyBUF_SIMPLE, 8, "ql", "int64", first_name) < 0) {
        return -1;
    }
    if (get_array(second, b, PyBUF_SIMPLE, 8, "ql", "int64", second_name) < 0) {
        PyBuffer_Release(a);
        return -1;
    }
    if (a->len != b->len) {
        PyErr_Format(PyExc_ValueError, "%zd %s but %zd %s", a->len / 8, first_name, b->len / 8,
                     second_name);
        PyBuffer_Release(a);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

static PyObject *crc32c_ranges(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"", "", "", "", "portable", NULL};
    PyObject *data_obj, *starts_obj, *ends_obj, *out_obj;
    (void)self;
    int portable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO|$p:crc32c_ranges", keywords, &data_obj,
                                     &starts_obj, &ends_obj, &out_obj, &portable)) {
        return NULL;
    }
    Py_buffer data, starts, ends, out;
    if (PyObject_GetBuffer(data_obj, &data, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (get_pair(starts_obj, ends_obj, &starts, &ends, "starts", "ends") < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    if (get_array(out_obj, &out, PyBUF_WRITABLE, 4, "IL", "uint32", "out") < 0) {
        goto release;
    }
    Py_ssize_t n = starts.len / 8;
    if (out.len / 4 != n) {
        PyErr_Format(PyExc_ValueError, "out holds %zd items for %zd ranges", out.len / 4, n);
        PyBuffer_Release(&out);
        goto release;
    }
    const uint8_t *bytes = data.buf;
    const int64_t *s = starts.buf, *e = ends.buf;
    uint32_t *o = out.buf;
    Py_ssize_t size = data.len, bad = -1;
    int64_t bad_start = 0, bad_end = 0;
    PyThreadState *saved = size >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    Py_ssize_t i = 0;
    while (i < n) {
        int64_t a[3], b[3];
        int group = n - i < 3 ? (int)(n - i) : 3, valid = 0;
        for (; valid < group; valid++) {
            a[valid] = LOAD_ONCE(&s[i + valid]), b[valid] = LOAD_ONCE(&e[i + valid]);
            if (a[valid] < 0 || a[valid] > b[valid] || b[valid] > size) {
                bad = i + valid, bad_start = a[valid], bad_end = b[valid];
                break;
            }
        }
        int64_t length[3] = {0, 0, 0};
        for (int k = 0; k < valid; k++) {
            length[k] = b[k] - a[k];
        }
        if (valid > 0) {
            crc_group(portable, bytes, a, length, valid, o + i);
        }
        if (bad >= 0) {
            break;
        }
        i += group;
    }
    if (saved) {
        PyEval_RestoreThread(saved);
    }
    PyBuffer_Release(&out);
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError,
                     "range %zd, [%lld, %lld), is not within the buffer of %zd bytes", bad,
                     (long long)bad_start, (long long)bad_end, size);
        goto release;
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    Py_RETURN_NONE;
release:
    PyBuffer_Release(&data);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    return NULL;
}

static PyObject *stamp_record_crcs(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"", "", "", "portable", NULL};
    PyObject *data_obj, *positions_obj, *sizes_obj;
    (void)self;
    int portable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|$p:stamp_record_crcs", keywords,
                                     &data_obj, &positions_obj, &sizes_obj, &portable)) {
        return NULL;
    }
    Py_buffer data, positions, sizes;
    if (PyObject_GetBuffer(data_obj, &data, PyBUF_WRITABLE) < 0) {
        return NULL;
    }
    if (get_pair(positions_obj, sizes_obj, &positions, &sizes, "positions", "sizes") < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    uint8_t *bytes = data.buf;
    const int64_t *p = positions.buf, *z = sizes.buf;
    Py_ssize_t n = positions.len / 8, size = data.len, bad = -1;
    int64_t bad_position = 0, bad_size = 0;
    PyThreadState *saved = size >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    Py_ssize_t i = 0;
    while (i < n) {
        int64_t at[3], length[3];
        uint32_t crc[3];
        int group = n - i < 3 ? (int)(n - i) : 3, valid = 0;
        for (; valid < group; valid++) {
            at[valid] = LOAD_ONCE(&p[i + valid]), length[valid] = LOAD_ONCE(&z[i + valid]);
            if (at[valid] < 0 || length[valid] < 4 || length[valid] > size - at[valid]) {
                bad = i + valid, bad_position = at[valid], bad_size = length[valid];
                break;
            }
        }
        int64_t body[3] = {0, 0, 0}, span[3] = {0, 0, 0};
        for (int k = 0; k < valid; k++) {
            body[k] = at[k] + 4, span[k] = length[k] - 4;
        }
        if (valid > 0) {
            crc_group(portable, bytes, body, span, valid, crc);
        }
        for (int k = 0; k < valid; k++) {
            uint32_t value = crc[k];
            uint8_t *field = bytes + at[k];
            field[0] = (uint8_t)value;
            field[1] = (uint8_t)(value >> 8);
            field[2] = (uint8_t)(value >> 16);
            field[3] = (uint8_t)(value >> 24);
        }
        if (bad >= 0) {
            break;
        }
        i += group;
    }
    if (saved) {
        PyEval_RestoreThread(saved);
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&positions);
    PyBuffer_Release(&sizes);
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError,
                     "record %zd, %lld bytes at %lld, is not a record within the buffer of %zd "
                     "bytes (at least 4 bytes, its CRC field)",
                     bad, (long long)bad_size, (long long)bad_position, size);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* A one-dimensional int64 array with any stride (a field of a numpy structured array). */
static int get_strided(PyObject *obj, Py_buffer *view, Py_ssize_t n, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_STRIDES | PyBUF_FORMAT) < 0) {
        return -1;
    }
    const char *format = view->format ? view->format : "B";
    if (*format == '@' || *format == '=' || (PY_LITTLE_ENDIAN && *format == '<') ||
        (!PY_LITTLE_ENDIAN && *format == '>')) {
        format++;
    }
    if (view->ndim != 1 || view->itemsize != 8 || format[0] == '\0' || format[1] != '\0' ||
        strchr("ql", format[0]) == NULL) {
        PyErr_Format(PyExc_TypeError, "%s must be a one-dimensional array of int64", name);
        PyBuffer_Release(view);
        return -1;
    }
    if (view->shape[0] != n) {
        PyErr_Format(PyExc_ValueError, "%zd %s for %zd records", view->shape[0], name, n);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static inline uint32_t load_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline int64_t load_le64(const uint8_t *p) {
    return (int64_t)((uint64_t)load_le32(p) | (uint64_t)load_le32(p + 4) << 32);
}

static inline int64_t strided_at(const Py_buffer *view, Py_ssize_t i) {
    int64_t value;
    memcpy(&value, (const char *)view->buf + i * view->strides[0], 8);
    return value;
}

#define RECORD_HEADER 36 /* crc u32, size u32, offset i64, timestamp i64, ... (docs/format.md) */

/* Whether record i (its CRC computed) agrees with its header and its index entry. */
static inline int record_agrees(const uint8_t *record, uint32_t crc, int64_t size, int64_t offset,
                                int64_t timestamp) {
    return load_le32(record) == crc && (int64_t)load_le32(record + 4) == size &&
           load_le64(record + 8) == offset && load_le64(record + 16) == timestamp;
}

static PyObject *check_records(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"", "", "", "", "", "portable", NULL};
    PyObject *data_obj, *positions_obj, *sizes_obj, *offsets_obj, *timestamps_obj;
    (void)self;
    int portable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO|$p:check_records", keywords, &data_obj,
                                     &positions_obj, &sizes_obj, &offsets_obj, &timestamps_obj,
                                     &portable)) {
        return NULL;
    }
    Py_buffer data, positions, sizes, offsets, timestamps;
    if (PyObject_GetBuffer(data_obj, &data, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (get_pair(positions_obj, sizes_obj, &positions, &sizes, "positions", "sizes") < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    Py_ssize_t n = positions.len / 8;
    if (get_strided(offsets_obj, &offsets, n, "offsets") < 0) {
        goto release;
    }
    if (get_strided(timestamps_obj, &timestamps, n, "timestamps") < 0) {
        PyBuffer_Release(&offsets);
        goto release;
    }
    const uint8_t *bytes = data.buf;
    const int64_t *p = positions.buf, *z = sizes.buf;
    Py_ssize_t size = data.len;
    long kind = 0;
    Py_ssize_t at = -1;
    PyThreadState *saved = size >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < n; i++) { /* every entry inside the buffer before any CRC */
        int64_t at_i = LOAD_ONCE(&p[i]), size_i = LOAD_ONCE(&z[i]);
        if (at_i < 0 || size_i < RECORD_HEADER || size_i > size - at_i) {
            kind = 1, at = i;
            break;
        }
    }
    for (Py_ssize_t i = 0; kind == 0 && i < n; i += 3) {
        /* p and z may change under a released GIL: each value is read once, and checked. */
        int64_t start[3], length[3];
        uint32_t crc[3];
        int group = n - i < 3 ? (int)(n - i) : 3;
        for (int k = 0; k < group; k++) {
            start[k] = LOAD_ONCE(&p[i + k]), length[k] = LOAD_ONCE(&z[i + k]);
            if (start[k] < 0 || length[k] < RECORD_HEADER || length[k] > size - start[k]) {
                kind = 1, at = i + k;
                break;
            }
        }
        if (kind != 0) {
            break;
        }
        int64_t body[3] = {0, 0, 0}, span[3] = {0, 0, 0};
        for (int k = 0; k < group; k++) {
            body[k] = start[k] + 4, span[k] = length[k] - 4;
        }
        crc_group(portable, bytes, body, span, group, crc);
        for (int k = 0; k < group; k++) {
            if (!record_agrees(bytes + start[k], crc[k], length[k], strided_at(&offsets, i + k),
                               strided_at(&timestamps, i + k))) {
                kind = 2, at = i + k;
                break;
            }
        }
    }
    if (saved) {
        PyEval_RestoreThread(saved);
    }
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&timestamps);
    PyBuffer_Release(&data);
    PyBuffer_Release(&positions);
    PyBuffer_Release(&sizes);
    return Py_BuildValue("(ln)", kind, at);
release:
    PyBuffer_Release(&data);
    PyBuffer_Release(&positions);
    PyBuffer_Release(&sizes);
    return NULL;
}

static PyObject *hardware(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyBool_FromLong(hardware_update != NULL);
}

static PyMethodDef methods[] = {
    {"crc32c_ranges", (PyCFunction)(void (*)(void))crc32c_ranges, METH_VARARGS | METH_KEYWORDS,
     "crc32c_ranges(data, starts, ends, out, *, portable=False)\n--\n\n"
     "out[i] = CRC-32C of data[starts[i]:ends[i]] (int64 starts and ends, uint32 out)."},
    {"stamp_record_crcs", (PyCFunction)(void (*)(void))stamp_record_crcs,
     METH_VARARGS | METH_KEYWORDS,
     "stamp_record_crcs(data, positions, sizes, *, portable=False)\n--\n\n"
     "Writes each record's CRC-32C of its bytes [4, size) into its bytes [0, 4), little-endian."},
    {"check_records", (PyCFunction)(void (*)(void))check_records, METH_VARARGS | METH_KEYWORDS,
     "check_records(data, positions, sizes, offsets, timestamps, *, portable=False)\n--\n\n"
     "(0, -1) when every record agrees with its CRC and its index entry; (1, i) when entry i\n"
     "lies outside data or is shorter than a record header (checked for all first); (2, i)\n"
     "for the first record whose CRC, size, offset or timestamp disagrees."},
    {"hardware", hardware, METH_NOARGS,
     "hardware()\n--\n\nWhether the CPU's crc32 instruction is used (SSE4.2)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "tidelog._crc32c",
    "CRC-32C of many byte ranges of one buffer in one call (src/tidelog/native/crc32c.c).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__crc32c(void) {
    build_tables();
#ifdef TIDELOG_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        hardware_update = update_sse42;
    }
#endif
    return PyModule_Create(&module);
}
