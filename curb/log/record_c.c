/* The record format's per-record steps in C: a record's header line written, parsed and
 * its CRC checked, for the compiled build.
 *
 * curb/log/record.py is the format's definition and its pure-Python build; it hands
 * these three steps here when this module is built (setup.py, beside the mypyc modules).
 * Written with str.format-like calls, struct and zlib, each step is a dozen CPython calls
 * a record (about 12,000 instructions to encode a header, 9,000 to parse one); here each
 * is one call.
 *
 * The contract with record.py: for any input, each function returns what the Python step
 * returns, or None, which means "not mine": the input is one the Python step rejects
 * (it then raises its own error) or is outside what this module does (a payload of
 * FAST_CRC_FROM bytes and more, whose CRC comes from zlib-ng; a negative offset). So the
 * two builds accept the same records and write the same bytes; tests/test_record_c.py
 * compares them on generated and damaged headers.
 *
 * The CRC is CRC-32 (IEEE, reflected, as zlib's crc32), eight bytes a step.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The layout of a header line, as record.py's module docstring draws it. */
#define RECORD_HEADER 103
#define CRC_FROM 33
#define CRC_TO 93
#define ALIGN 32
#define FAST_CRC_FROM (16 * 1024)
#define TAG_MASK 0xFFFFFFu
#define COPY_FLAG (1ULL << 47)
#define MAX_DELIVERIES 0xFFFFFFFFULL
#define LIMIT48 (1ULL << 48)

/* Each field: where its digits start and how many there are. */
enum { DELIVERIES = 4, DUE = 13, TAG = 26, ID = 33, WSEQ = 46, STAMP = 59, EXPIRES = 72, LENGTH = 85, CRC = 94 };
static const int SPACES[] = {3, 12, 25, 32, 45, 58, 71, 84, 93};
static const char *const STATES[] = {"rdy", "ack", "pad", "max", "exp"};
#define N_STATES 5
#define PAD_STATE 2

static PyObject *state_objects[N_STATES]; /* the states as bytes, made once */
static uint32_t crc_table[8][256];

static void crc_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][n] = c;
    }
    /* crc_table[k][n]: the CRC step for byte n followed by k zero bytes. */
    for (uint32_t n = 0; n < 256; n++)
        for (int k = 1; k < 8; k++)
            crc_table[k][n] = crc_table[0][crc_table[k - 1][n] & 0xff] ^ (crc_table[k - 1][n] >> 8);
}

static inline uint32_t load32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* zlib.crc32(p[:n], crc). */
static uint32_t crc_update(uint32_t crc, const unsigned char *p, Py_ssize_t n)
{
    crc = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo = crc ^ load32(p), hi = load32(p + 4);
        crc = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^ crc_table[5][(lo >> 16) & 0xff]
            ^ crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff]
            ^ crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
    }
    for (; n > 0; n--, p++)
        crc = crc_table[0][(crc ^ *p) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static void put_hex(char *out, uint64_t value, int digits)
{
    static const char HEX[] = "0123456789abcdef";
    for (int i = digits - 1; i >= 0; i--, value >>= 4)
        out[i] = HEX[value & 15];
}

/* A digit's value, or -1 (bytes.fromhex takes either case). */
static inline int hex_value(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c |= 0x20;
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The field of `digits` hex digits at line[at], or -1 if one is no hex digit. */
static int64_t get_hex(const unsigned char *line, int at, int digits)
{
    int64_t value = 0;
    for (int i = 0; i < digits; i++) {
        int v = hex_value(line[at + i]);
        if (v < 0)
            return -1;
        value = value << 4 | v;
    }
    return value;
}

/* An int argument as an unsigned number below `limit`; 0 (no error set) if it is none. */
static int get_number(PyObject *arg, uint64_t limit, uint64_t *out)
{
    if (!PyLong_Check(arg))
        return 0;
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(arg, &overflow);
    if (overflow || value < 0 || (uint64_t)value >= limit) {
        if (value == -1 && PyErr_Occurred())
            PyErr_Clear();
        return 0;
    }
    *out = (uint64_t)value;
    return 1;
}

/* encode(state, deliveries, msg_id, wseq, stamp, payload, due_ms, expires_ms): the header
 * line that record.encode_record writes (stamp with COPY_FLAG already applied), or None. */
static PyObject *encode(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 8)
        Py_RETURN_NONE;
    uint64_t deliveries, msg_id, wseq, stamp, due, expires;
    if (!PyBytes_Check(args[0]) || PyBytes_GET_SIZE(args[0]) != 3 || !PyBytes_Check(args[5])
        || !PyLong_Check(args[1]) || !get_number(args[2], LIMIT48, &msg_id) || !get_number(args[3], LIMIT48, &wseq)
        || !get_number(args[4], LIMIT48, &stamp) || !get_number(args[6], LIMIT48, &due)
        || !get_number(args[7], LIMIT48, &expires))
        Py_RETURN_NONE;
    Py_ssize_t length = PyBytes_GET_SIZE(args[5]);
    if (length >= FAST_CRC_FROM)
        Py_RETURN_NONE;
    int overflow = 0;
    long long count = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    if (overflow < 0 || (!overflow && count < 0))
        Py_RETURN_NONE;
    deliveries = overflow || (uint64_t)count > MAX_DELIVERIES ? MAX_DELIVERIES : (uint64_t)count;

    PyObject *result = PyBytes_FromStringAndSize(NULL, RECORD_HEADER);
    if (result == NULL)
        return NULL;
    char *line = PyBytes_AS_STRING(result);
    memcpy(line, PyBytes_AS_STRING(args[0]), 3);
    for (size_t i = 0; i < sizeof SPACES / sizeof SPACES[0]; i++)
        line[SPACES[i]] = ' ';
    put_hex(line + DELIVERIES, deliveries, 8);
    put_hex(line + DUE, due, 12);
    put_hex(line + TAG, wseq & TAG_MASK, 6);
    put_hex(line + ID, msg_id, 12);
    put_hex(line + WSEQ, wseq, 12);
    put_hex(line + STAMP, stamp, 12);
    put_hex(line + EXPIRES, expires, 12);
    put_hex(line + LENGTH, (uint64_t)length, 8);
    uint32_t crc = crc_update(0, (const unsigned char *)line + CRC_FROM, CRC_TO - CRC_FROM);
    crc = crc_update(crc, (const unsigned char *)PyBytes_AS_STRING(args[5]), length);
    put_hex(line + CRC, crc, 8);
    line[RECORD_HEADER - 1] = '\n';
    return result;
}

/* A bytes or bytearray argument's bytes, without a copy; 0 if it is neither. */
static int get_bytes(PyObject *arg, const unsigned char **data, Py_ssize_t *size)
{
    if (PyBytes_Check(arg)) {
        *data = (const unsigned char *)PyBytes_AS_STRING(arg);
        *size = PyBytes_GET_SIZE(arg);
        return 1;
    }
    if (PyByteArray_Check(arg)) {
        *data = (const unsigned char *)PyByteArray_AS_STRING(arg);
        *size = PyByteArray_GET_SIZE(arg);
        return 1;
    }
    return 0;
}

static int get_offset(PyObject *arg, Py_ssize_t *out)
{
    if (!PyLong_Check(arg))
        return 0;
    Py_ssize_t value = PyLong_AsSsize_t(arg);
    if (value == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = value;
    return value >= 0;
}

/* parse(buf, pos): the fields record.parse_header gives a RecordHeader, in the order of
 * its __init__ (state, deliveries, id, wseq, time, length, crc, copy, due, expires,
 * size), or None when the header at buf[pos:] is not well formed. */
static PyObject *parse(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    const unsigned char *buf;
    Py_ssize_t size, pos;
    if (nargs != 2 || !get_bytes(args[0], &buf, &size) || !get_offset(args[1], &pos) || size - pos < RECORD_HEADER)
        Py_RETURN_NONE;
    const unsigned char *line = buf + pos;
    if (line[RECORD_HEADER - 1] != '\n')
        Py_RETURN_NONE;
    int state = 0;
    while (state < N_STATES && memcmp(line, STATES[state], 3) != 0)
        state++;
    if (state == N_STATES)
        Py_RETURN_NONE;
    for (size_t i = 0; i < sizeof SPACES / sizeof SPACES[0]; i++)
        if (line[SPACES[i]] != ' ')
            Py_RETURN_NONE;
    int64_t deliveries = get_hex(line, DELIVERIES, 8), due = get_hex(line, DUE, 12), tag = get_hex(line, TAG, 6),
            msg_id = get_hex(line, ID, 12), wseq = get_hex(line, WSEQ, 12), stamp = get_hex(line, STAMP, 12),
            expires = get_hex(line, EXPIRES, 12), length = get_hex(line, LENGTH, 8), crc = get_hex(line, CRC, 8);
    if (deliveries < 0 || due < 0 || tag < 0 || msg_id < 0 || wseq < 0 || stamp < 0 || expires < 0 || length < 0
        || crc < 0)
        Py_RETURN_NONE;
    if ((uint64_t)tag != ((uint64_t)wseq & TAG_MASK) || (state == PAD_STATE) != (msg_id == 0 && length == 0))
        Py_RETURN_NONE;
    int64_t values[] = {deliveries, msg_id, wseq, (int64_t)((uint64_t)stamp & ~COPY_FLAG), length, crc, -1,
                        due, expires, (RECORD_HEADER + length + ALIGN) & -(int64_t)ALIGN};
    PyObject *fields = PyTuple_New(11);
    if (fields == NULL)
        return NULL;
    Py_INCREF(state_objects[state]);
    PyTuple_SET_ITEM(fields, 0, state_objects[state]);
    for (int i = 0; i < 10; i++) {
        PyObject *item = i == 6 ? PyBool_FromLong(((uint64_t)stamp & COPY_FLAG) != 0) : PyLong_FromLongLong(values[i]);
        if (item == NULL) {
            Py_DECREF(fields);
            return NULL;
        }
        PyTuple_SET_ITEM(fields, i + 1, item);
    }
    return fields;
}

/* crc_matches(buf, pos, size, length, crc): record._crc_matches for a payload below
 * FAST_CRC_FROM bytes in bytes or a bytearray, or None. */
static PyObject *crc_matches(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    const unsigned char *buf;
    Py_ssize_t size, pos, record, length;
    uint64_t crc;
    if (nargs != 5 || !get_bytes(args[0], &buf, &size) || !get_offset(args[1], &pos) || !get_offset(args[2], &record)
        || !get_offset(args[3], &length) || length >= FAST_CRC_FROM || !get_number(args[4], LIMIT48, &crc)
        || record > PY_SSIZE_T_MAX - pos)
        Py_RETURN_NONE;
    Py_ssize_t end = pos + record;
    if (end < 1)
        Py_RETURN_NONE;
    if (size < end || buf[end - 1] != '\n')
        Py_RETURN_FALSE;
    /* The slices record.py takes, clamped to the buffer as Python's are. */
    Py_ssize_t from = pos + CRC_FROM < size ? pos + CRC_FROM : size;
    Py_ssize_t to = pos + CRC_TO < size ? pos + CRC_TO : size;
    Py_ssize_t body = pos + RECORD_HEADER < size ? pos + RECORD_HEADER : size;
    Py_ssize_t body_end = length < size - body ? body + length : size;
    uint32_t value = crc_update(0, buf + from, to > from ? to - from : 0);
    value = crc_update(value, buf + body, body_end - body);
    return PyBool_FromLong(value == crc);
}

/* crc32(data, value): zlib.crc32 of bytes, for the tests of this module's CRC. */
static PyObject *crc32(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    const unsigned char *data;
    Py_ssize_t size;
    uint64_t value;
    if (nargs != 2 || !get_bytes(args[0], &data, &size) || !get_number(args[1], 1ULL << 32, &value)) {
        PyErr_SetString(PyExc_TypeError, "crc32(bytes, int) with an int from 0 to 2**32-1");
        return NULL;
    }
    return PyLong_FromUnsignedLong(crc_update((uint32_t)value, data, size));
}

static PyMethodDef methods[] = {
    {"encode", (PyCFunction)(void (*)(void))encode, METH_FASTCALL, "A record's header line, or None."},
    {"parse", (PyCFunction)(void (*)(void))parse, METH_FASTCALL, "A record header's fields, or None."},
    {"crc_matches", (PyCFunction)(void (*)(void))crc_matches, METH_FASTCALL,
     "Whether a record's CRC matches, or None."},
    {"crc32", (PyCFunction)(void (*)(void))crc32, METH_FASTCALL, "CRC-32 of bytes, as zlib.crc32."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "curb.log.record_c", "The record format's per-record steps in C.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_record_c(void)
{
    crc_init();
    for (int i = 0; i < N_STATES; i++) {
        if (state_objects[i] == NULL) {
            state_objects[i] = PyBytes_FromStringAndSize(STATES[i], 3);
            if (state_objects[i] == NULL)
                return NULL;
        }
    }
    return PyModule_Create(&module);
}
