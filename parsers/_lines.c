/* The byte work of reading text logs, a pass over the bytes or the lines for each step, where
 * Polars would take a pass over every line for each of a dozen string operations:
 *   - splitting an ASCII block into lines (parsers/lines.py): where each line starts (64 bytes at
 *     a time, the tests for a byte not ASCII and for a CR in the same pass), which of the common rank tags starts it, each
 *     line's text as an Arrow string view into the block (not a copy of it), written into Arrow
 *     memory the column then stands on;
 *   - taking each line's glog / c10 header apart (parsers/textlog.py): its run of lines of one
 *     header, level, time, where its source lies, and its message (views again).
 *
 * It decides nothing the Python modules do not: lines._ascii_frame and textlog._native_runs call
 * it, and the Polars code beside them (the reference, and the path where it is not built) gives
 * the same frames (tests/test_ascii_split.py, tests/test_native_headers.py). A real line it
 * reads, from a rank's stderr under PyTorch 2.11:
 *
 *     [rank0]:V1129 16:46:06.548000 844 torch/_dynamo/guards.py:4760] [0/1] [__recompiles] ...
 *
 * Input is a log, hostile: every read is bounded by the end of its block or string.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* An Arrow string view (16 bytes) of the ``len`` bytes at ``bytes``, which lie at ``offset`` in
 * buffer ``buffer`` of the view array: its length, then the string itself when 12 bytes or
 * fewer (zeros after it), else its first 4 bytes, the buffer's index and the offset. */
static inline void make_view(uint8_t *view, const uint8_t *bytes, int32_t len, uint32_t buffer, uint32_t offset) {
    memcpy(view, &len, 4);
    if (len <= 12) {
        memset(view + 4, 0, 12);
        memcpy(view + 4, bytes, (size_t)len);
    } else {
        memcpy(view + 4, bytes, 4);
        memcpy(view + 8, &buffer, 4);
        memcpy(view + 12, &offset, 4);
    }
}

/* A view of data[at:at+len], the block being the view array's buffer 0. */
static inline void string_view(uint8_t *view, const uint8_t *data, int64_t at, int64_t len) {
    make_view(view, data + at, (int32_t)len, 0, (uint32_t)at);
}

/* Whether a whole rank tag, "[" letters or "_" digits "]:" (lines._TAG), starts at p (before end). */
static inline int starts_with_tag(const uint8_t *p, const uint8_t *end) {
    if (p >= end || *p != '[')
        return 0;
    const uint8_t *q = ++p;
    while (q < end && ((*q >= 'A' && *q <= 'Z') || (*q >= 'a' && *q <= 'z') || *q == '_'))
        q++;
    if (q == p)
        return 0;
    const uint8_t *digits = q;
    while (q < end && *q >= '0' && *q <= '9')
        q++;
    return q > digits && end - q >= 2 && q[0] == ']' && q[1] == ':';
}

/* Ends of line i (starts holds n of them; the last line ends where the block does). */
static inline int64_t line_end(const int64_t *starts, Py_ssize_t n, Py_ssize_t i, int64_t size) {
    return i + 1 < n ? starts[i + 1] - 1 : size;
}

static int int64_buffer(PyObject *obj, Py_buffer *view, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0)
        return -1;
    if (view->len % 8) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s: not an array of int64", what);
        return -1;
    }
    return 0;
}

/* Where each line of a plain block (ASCII, no CR) starts, found 64 bytes at a time: a mask of the
 * chunk's newlines (a bit a byte), whose set bits are the lines' ends, and whether the chunk holds
 * a byte that is not ASCII (the top bit of the OR of its bytes) or a CR. One pass over the block,
 * where a count of its lines, their starts and the two tests were four. Returns the number of
 * starts (in *out, PyMem memory, the caller's to free), -1 where the block is not plain, -2 out of
 * memory. */
#if defined(__SSE2__)
#include <emmintrin.h>
static inline uint64_t newline_mask(const uint8_t *p, int *not_plain) {
    const __m128i nl = _mm_set1_epi8('\n'), cr = _mm_set1_epi8('\r');
    __m128i a = _mm_loadu_si128((const __m128i *)p), b = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(p + 32)), d = _mm_loadu_si128((const __m128i *)(p + 48));
    __m128i crs = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(a, cr), _mm_cmpeq_epi8(b, cr)),
                               _mm_or_si128(_mm_cmpeq_epi8(c, cr), _mm_cmpeq_epi8(d, cr)));
    *not_plain |= _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(_mm_or_si128(a, b), _mm_or_si128(c, d)), crs)) != 0;
    return (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(a, nl))
           | (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(b, nl)) << 16
           | (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(c, nl)) << 32
           | (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(d, nl)) << 48;
}
#else
static inline uint64_t newline_mask(const uint8_t *p, int *not_plain) {
    uint64_t mask = 0;
    for (int j = 0; j < 64; j++) {
        *not_plain |= (p[j] & 0x80) || p[j] == '\r';
        mask |= (uint64_t)(p[j] == '\n') << j;
    }
    return mask;
}
#endif

/* ``starts`` with room for ``need`` offsets (doubled as it fills), or NULL (out of memory: freed). */
static int64_t *room_for(int64_t *starts, Py_ssize_t *capacity, Py_ssize_t need) {
    if (need <= *capacity)
        return starts;
    while (*capacity < need)
        *capacity *= 2;
    int64_t *more = PyMem_RawRealloc(starts, (size_t)*capacity * 8);
    if (!more)
        PyMem_RawFree(starts);
    return more;
}

static Py_ssize_t plain_starts(const uint8_t *data, int64_t size, int64_t **out) {
    Py_ssize_t n = 0, capacity = size / 64 + 64;
    int64_t *starts = PyMem_RawMalloc((size_t)capacity * 8);
    if (!starts)
        return -2;
    starts[n++] = 0;
    int not_plain = 0;
    int64_t at = 0;
    for (; at + 64 <= size; at += 64) {
        if (!(starts = room_for(starts, &capacity, n + 64)))  /* (a chunk ends 64 lines at most) */
            return -2;
        for (uint64_t mask = newline_mask(data + at, &not_plain); mask; mask &= mask - 1)
            starts[n++] = at + __builtin_ctzll(mask) + 1;
        if (not_plain) {
            PyMem_RawFree(starts);
            return -1;
        }
    }
    if (!(starts = room_for(starts, &capacity, n + 64)))  /* (and the tail, under 64 bytes) */
        return -2;
    for (; at < size; at++) {
        if ((data[at] & 0x80) || data[at] == '\r') {
            PyMem_RawFree(starts);
            return -1;
        }
        if (data[at] == '\n')
            starts[n++] = at + 1;
    }
    *out = starts;
    return n;
}

/* plain_line_starts(block) -> bytes or None: the offset (int64) where each line starts (a final
 * newline ends the last line but one, and an empty last line follows it, as str.split("\n") has
 * it); None where a byte of the block is not ASCII or is a CR. */
static PyObject *plain_line_starts(PyObject *self, PyObject *args) {
    Py_buffer block;
    if (!PyArg_ParseTuple(args, "y*", &block))
        return NULL;
    int64_t *starts = NULL;
    Py_ssize_t n;
    Py_BEGIN_ALLOW_THREADS
    n = plain_starts(block.buf, block.len, &starts);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&block);
    if (n == -2)
        return PyErr_NoMemory();
    if (n == -1)
        Py_RETURN_NONE;
    PyObject *out = PyBytes_FromStringAndSize((const char *)starts, n * 8);
    PyMem_RawFree(starts);
    return out;
}

/* A writable buffer of ``n`` string views (16 bytes each), held in *view. */
static int views_out(PyObject *obj, Py_buffer *view, Py_ssize_t n, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE) < 0)
        return -1;
    if (view->len != n * 16) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s: a buffer of 16 bytes a line", what);
        return -1;
    }
    return 0;
}

/* tag_views(block, starts, tags, texts, max_chars) -> bytes: for each line, the index (int32) in
 * ``tags`` (a tuple of bytes, each one rank tag or two) of the first it starts with, or len(tags)
 * for none; a tag of one followed by a whole second tag does not count (lines._starting_with: the
 * prefix regex would take both off). Into ``texts`` (writable, 16 bytes a line) it writes the
 * string view (into the block) of each tagged line's text after its tag, at most max_chars bytes;
 * a line with none gets an empty view, for cut_views to write once the regex has cut its prefix. */
static PyObject *tag_views(PyObject *self, PyObject *args) {
    Py_buffer block, starts_view, texts;
    PyObject *starts_obj, *tags, *texts_obj, *out = NULL;
    Py_ssize_t max_chars;
    if (!PyArg_ParseTuple(args, "y*OO!On", &block, &starts_obj, &PyTuple_Type, &tags, &texts_obj, &max_chars))
        return NULL;
    if (int64_buffer(starts_obj, &starts_view, "starts") < 0) {
        PyBuffer_Release(&block);
        return NULL;
    }
    const uint8_t *data = block.buf;
    int64_t size = block.len;
    const int64_t *starts = starts_view.buf;
    Py_ssize_t n = starts_view.len / 8, count = PyTuple_GET_SIZE(tags);
    if (views_out(texts_obj, &texts, n, "tag_views") < 0) {
        PyBuffer_Release(&starts_view);
        PyBuffer_Release(&block);
        return NULL;
    }
    const char *tag[16];
    Py_ssize_t tag_len[16];
    int one_tag[16];
    if (count > 16 || size > INT32_MAX || max_chars < 0) {
        PyErr_SetString(PyExc_ValueError, "tag_views: 16 tags at most, a block under 2 GiB");
        goto done;
    }
    for (Py_ssize_t t = 0; t < count; t++) {
        PyObject *item = PyTuple_GET_ITEM(tags, t);
        if (!PyBytes_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "tags: bytes");
            goto done;
        }
        tag[t] = PyBytes_AS_STRING(item);
        tag_len[t] = PyBytes_GET_SIZE(item);
        int closes = 0;
        for (Py_ssize_t j = 0; j + 1 < tag_len[t]; j++)
            closes += tag[t][j] == ']' && tag[t][j + 1] == ':';
        one_tag[t] = closes == 1;
    }
    if (!(out = PyBytes_FromStringAndSize(NULL, n * 4)))
        goto done;
    int32_t *index = (int32_t *)PyBytes_AS_STRING(out);
    uint8_t *views = texts.buf;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t at = starts[i], end = line_end(starts, n, i, size);
        if (at < 0 || end > size || at > end) {
            bad = 1;
            break;
        }
        index[i] = (int32_t)count;
        memset(views + 16 * i, 0, 16);
        for (Py_ssize_t t = 0; t < count; t++) {
            if (end - at >= tag_len[t] && memcmp(data + at, tag[t], (size_t)tag_len[t]) == 0) {
                if (!(one_tag[t] && starts_with_tag(data + at + tag_len[t], data + end))) {
                    index[i] = (int32_t)t;
                    int64_t from = at + tag_len[t];
                    string_view(views + 16 * i, data, from, end - from > max_chars ? max_chars : end - from);
                }
                break;
            }
        }
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        Py_CLEAR(out);
        PyErr_SetString(PyExc_ValueError, "tag_views: a line outside the block");
    }
done:
    PyBuffer_Release(&texts);
    PyBuffer_Release(&starts_view);
    PyBuffer_Release(&block);
    return out;
}

/* Where line i lies in the block (``at`` to ``end``), 0 where it does not (a caller's mistake). */
static inline int line_at(const int64_t *starts, Py_ssize_t n, Py_ssize_t i, int64_t size, int64_t *at, int64_t *end) {
    if (i < 0 || i >= n)
        return 0;
    *at = starts[i];
    *end = line_end(starts, n, i, size);
    return *at >= 0 && *end <= size && *at <= *end;
}

/* row_views(block, starts, rows, max_chars) -> bytes: the whole text of each line of ``rows``
 * (uint32 line numbers, from 0), at most ``max_chars`` bytes of it, as Arrow string views into the
 * block: the few lines that start with no common tag, whose prefixes a regex takes off. */
static PyObject *row_views(PyObject *self, PyObject *args) {
    Py_buffer block, starts_view, rows_view;
    PyObject *starts_obj, *result = NULL;
    Py_ssize_t max_chars;
    if (!PyArg_ParseTuple(args, "y*Oy*n", &block, &starts_obj, &rows_view, &max_chars))
        return NULL;
    if (int64_buffer(starts_obj, &starts_view, "starts") < 0)
        goto release;
    const int64_t *starts = starts_view.buf;
    const uint32_t *rows = rows_view.buf;
    Py_ssize_t n = starts_view.len / 8, m = rows_view.len / 4;
    if (rows_view.len % 4 || block.len > INT32_MAX || max_chars < 0) {
        PyErr_SetString(PyExc_ValueError, "row_views: uint32 rows, a block under 2 GiB");
        goto done;
    }
    PyObject *views = PyBytes_FromStringAndSize(NULL, m * 16);
    if (!views)
        goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(views);
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < m && !bad; j++) {
        int64_t at, end;
        if (!(bad = !line_at(starts, n, rows[j], block.len, &at, &end)))
            string_view(out + 16 * j, block.buf, at, end - at > max_chars ? max_chars : end - at);
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        Py_DECREF(views);
        PyErr_SetString(PyExc_ValueError, "row_views: a row or line outside the block");
        goto done;
    }
    result = views;
done:
    PyBuffer_Release(&starts_view);
release:
    PyBuffer_Release(&rows_view);
    PyBuffer_Release(&block);
    return result;
}

/* cut_views(block, starts, rows, cuts, texts, max_chars) -> None: writes into ``texts`` (tag_views'),
 * for each line of ``rows`` (uint32), the view of its text after the first ``cuts`` (int32) bytes
 * of it, the prefix the regex took off, at most max_chars bytes. */
static PyObject *cut_views(PyObject *self, PyObject *args) {
    Py_buffer block, starts_view, rows_view, cuts_view, texts;
    PyObject *starts_obj, *texts_obj, *result = NULL;
    Py_ssize_t max_chars;
    if (!PyArg_ParseTuple(args, "y*Oy*y*On", &block, &starts_obj, &rows_view, &cuts_view, &texts_obj, &max_chars))
        return NULL;
    if (int64_buffer(starts_obj, &starts_view, "starts") < 0)
        goto release;
    const int64_t *starts = starts_view.buf;
    const uint32_t *rows = rows_view.buf;
    const int32_t *cuts = cuts_view.buf;
    Py_ssize_t n = starts_view.len / 8, m = rows_view.len / 4;
    if (views_out(texts_obj, &texts, n, "cut_views") < 0)
        goto done;
    int bad = rows_view.len % 4 || cuts_view.len != rows_view.len || block.len > INT32_MAX || max_chars < 0;
    uint8_t *views = texts.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < m && !bad; j++) {
        int64_t at, end;
        bad = !line_at(starts, n, rows[j], block.len, &at, &end) || cuts[j] < 0 || cuts[j] > end - at;
        if (!bad) {
            at += cuts[j];
            string_view(views + 16 * rows[j], block.buf, at, end - at > max_chars ? max_chars : end - at);
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&texts);
    if (bad)
        PyErr_SetString(PyExc_ValueError, "cut_views: uint32 rows and int32 cuts, each inside its line");
    else
        result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&starts_view);
release:
    PyBuffer_Release(&cuts_view);
    PyBuffer_Release(&rows_view);
    PyBuffer_Release(&block);
    return result;
}

/* ---- log headers (parsers/textlog.py: HeaderRuns and with_headers, of which this is the byte work) ---- */

static inline int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

/* textlog._GLOG_HEAD's source class: printable ASCII but a space and "]". */
static inline int is_source_char(uint8_t c) { return c >= '!' && c <= '~' && c != ']'; }

/* The rest of a glog header from p: " +" [!-\\^-~]+ ":" \d+ "]" (the source, up to the line's
 * first "]", which must follow ":digits"). */
static int source_then_close(const uint8_t *p, const uint8_t *end) {
    if (p >= end || *p != ' ')
        return 0;
    while (p < end && *p == ' ')
        p++;
    const uint8_t *token = p;
    while (p < end && is_source_char(*p))
        p++;
    if (p >= end || *p != ']' || p == token || !is_digit(p[-1]))
        return 0;
    const uint8_t *q = p - 1;
    while (q > token && is_digit(*q))
        q--;
    return *q == ':' && q > token;
}

/* Whether the line starts with a glog or c10 header: textlog._GLOG_HEAD,
 *   ^\[?[IWEFCVD](?:\d{3,4} \d\d:\d\d:\d\d\.\d{1,9}(?: +\d+)?)? +[!-\\^-~]+:\d+\]
 * decided as the regex decides it: after the level, a digit can only start the time and a
 * space only the source; after the time, spaces and digits are the pid only where the source
 * does not follow the time directly. */
static int glog_head(const uint8_t *p, const uint8_t *end) {
    if (p < end && *p == '[')
        p++;
    if (p >= end || !strchr("IWEFCVD", *p) || *p == 0)
        return 0;
    p++;
    if (p < end && *p == ' ')
        return source_then_close(p, end);
    const uint8_t *d = p;
    while (p < end && is_digit(*p))
        p++;
    if (p - d < 3 || p - d > 4)
        return 0;
    static const char shape[] = " dd:dd:dd.";
    for (const char *c = shape; *c; c++, p++) {
        if (p >= end || (*c == 'd' ? !is_digit(*p) : *p != (uint8_t)*c))
            return 0;
    }
    d = p;
    while (p < end && is_digit(*p))
        p++;
    if (p == d || p - d > 9)
        return 0;
    if (source_then_close(p, end))
        return 1;
    /* " +\d+" (the pid), then the source */
    const uint8_t *q = p;
    while (q < end && *q == ' ')
        q++;
    if (q == p || q >= end || !is_digit(*q))
        return 0;
    while (q < end && is_digit(*q))
        q++;
    return source_then_close(q, end);
}

static inline int leap(int64_t y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

/* Days from 1970-01-01 to y-m-d (proleptic Gregorian; Howard Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static inline int two(const uint8_t *p) { return (p[0] - '0') * 10 + (p[1] - '0'); }

/* The microseconds since the epoch of a glog stamp, "MMDD HH:MM:SS.f" (f: 1 to 9 digits, cut to
 * microseconds) in the given year, when the stamp has that shape and its values are a real time;
 * else 0 (Polars' strptime decides it: lenient in ways not worth copying). */
static int stamp_micros(const uint8_t *s, int64_t len, int64_t year, int64_t *out) {
    if (len < 15 || len > 23)
        return 0;
    static const char shape[] = "dddd dd:dd:dd.";
    for (int i = 0; shape[i]; i++) {
        if (shape[i] == 'd' ? !is_digit(s[i]) : s[i] != (uint8_t)shape[i])
            return 0;
    }
    int64_t micros = 0, scale = 100000;
    for (int64_t i = 14; i < len; i++) {
        if (!is_digit(s[i]))
            return 0;
        if (scale) {
            micros += (s[i] - '0') * scale;
            scale /= 10;
        }
    }
    int month = two(s), day = two(s + 2), hour = two(s + 5), minute = two(s + 8), second = two(s + 11);
    static const int days_in[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (month < 1 || month > 12 || day < 1 || day > days_in[month - 1] + (month == 2 && leap(year)) ||
        hour > 23 || minute > 59 || second > 59)
        return 0;
    *out = ((days_from_civil(year, month, day) * 24 + hour) * 60 + minute) * 60 + second;
    *out = *out * 1000000 + micros;
    return 1;
}

static inline void set_bit(uint8_t *bits, Py_ssize_t i) { bits[i >> 3] |= (uint8_t)(1 << (i & 7)); }

/* The bytes a string view (of a view array whose data buffers are ``data``) points at. */
static inline const uint8_t *view_bytes(const uint8_t *view, const Py_buffer *data, Py_ssize_t buffers, int32_t len) {
    if (len <= 12)
        return view + 4;
    int32_t buffer, offset;
    memcpy(&buffer, view + 8, 4);
    memcpy(&offset, view + 12, 4);
    if (buffer < 0 || buffer >= buffers || offset < 0 || (Py_ssize_t)offset + len > data[buffer].len)
        return NULL;
    return (const uint8_t *)data[buffer].buf + offset;
}

/* The bytes of string i of a view array (its views ``views``, its data buffers ``data``), its length
 * in *len; NULL where the view points outside its buffers. */
static inline const uint8_t *string_at(const uint8_t *views, Py_ssize_t i, const Py_buffer *data, Py_ssize_t buffers,
                                       int32_t *len) {
    memcpy(len, views + 16 * i, 4);
    return *len < 0 ? NULL : view_bytes(views + 16 * i, data, buffers, *len);
}

/* A view of bytes [from, to) of the string ``view`` shows (``bytes``, its bytes). */
static inline void sub_view(uint8_t *out, const uint8_t *view, const uint8_t *bytes, int32_t from, int32_t to) {
    uint32_t buffer, offset;  /* (an inline string's are its bytes, unread: a part of it is inline too) */
    memcpy(&buffer, view + 8, 4);
    memcpy(&offset, view + 12, 4);
    make_view(out, bytes + from, to - from, buffer, offset + (uint32_t)from);
}

/* Where the first character (UTF-8) of a string ends, in bytes (0 for an empty one). */
static inline int32_t char_end(const uint8_t *s, int32_t len) {
    int32_t at = len > 0;
    while (at < len && (s[at] & 0xC0) == 0x80)
        at++;
    return at;
}

/* What a line's glog / c10 header says (textlog._glog_fields, for one line): all of it lies in
 * the line's head, its bytes up to the first "]" (``close``; -1: none) and one character more. */
struct header {
    int glog, time_known;
    int32_t start, close, msg_at;  /* where the level is (after a "["), the "]", the message */
    int64_t time_end, micros;      /* where the time ends (-1: nowhere), the time */
};

static struct header parse_header(const uint8_t *s, int32_t len, int32_t close, int32_t head_len, int64_t year) {
    struct header h = {0};
    h.time_end = -1;
    if (close < 0 || !glog_head(s, s + close + 1))
        return h;
    h.glog = 1;
    h.close = close;
    h.start = s[0] == '[';
    if (s[h.start + 1] == ' ') {
        h.time_end = h.start + 2;
    } else {
        for (int32_t j = 16; j < 26 && j < head_len; j++) {
            if (s[j] == ' ') {
                h.time_end = j;
                break;
            }
        }
    }
    h.msg_at = close + 1 + (close + 1 < len && s[close + 1] == ' ');
    /* the stamp, "MMDD HH:MM:SS.f", an unpadded month ("419 10:42:28...") padded */
    int64_t stamp_len = h.time_end - h.start - 1;
    if (h.time_end >= 0 && stamp_len > 0 && stamp_len < 31) {
        uint8_t stamp[32];
        const uint8_t *from = s + h.start + 1;
        int pad = stamp_len > 3 && from[3] == ' ';
        stamp[0] = '0';
        memcpy(stamp + pad, from, (size_t)stamp_len);
        h.time_known = stamp_micros(stamp, stamp_len + pad, year, &h.micros);
    }
    return h;
}

static void release_buffers(Py_buffer *held, Py_ssize_t count) {
    for (Py_ssize_t k = 0; k < count; k++)
        PyBuffer_Release(&held[k]);
    PyMem_Free(held);
}

/* The buffers of ``tuple`` (a view array's data buffers), held (release_buffers lets them go), their
 * number in *count; NULL with the error set, none held. */
static Py_buffer *hold_buffers(PyObject *tuple, Py_ssize_t *count) {
    Py_ssize_t n = PyTuple_GET_SIZE(tuple);
    Py_buffer *held = PyMem_Calloc(n ? n : 1, sizeof(Py_buffer));
    if (!held) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(tuple, k), &held[k], PyBUF_SIMPLE) < 0) {
            release_buffers(held, k);
            return NULL;
        }
    }
    *count = n;
    return held;
}

enum { HEADS, FIRSTS, GLOG, LEVELS, SRC_AT, SRC_AT_VALID, SRC_END, MSGS, TS, TS_VALID, OUTPUTS };

/* glog_headers(views, data, year, outs) -> bytes: into ``outs`` (a tuple of writable buffers, one
 * an output below in its order, each of 16 bytes a line for a view, 8 for an int64, 4 for a uint32,
 * a bit for a bit: Arrow memory the columns then stand on, not a copy of it), for each line of a
 * text column (Arrow string views ``views`` into the buffers ``data``):
 *   heads               the line up to its first "]" and one character more (all of it with no "]")
 *   firsts              bit: the line's head differs from the line before's (the first line's: set)
 *   glog                bit: the line starts with a glog / c10 header (textlog._GLOG_HEAD)
 *   levels              its level, a one-letter view (valid where glog)
 *   src_at, src_at_valid, src_end  int64 / uint32: where "[pid ]src:line" starts and ends
 *   msgs                a view of the text after the header (and the space after it)
 *   ts, ts_valid        int64 microseconds, where the header's time is a real one
 * and returns the rows (uint32) of glog lines whose time it leaves to Polars (an odd stamp). The
 * same values as textlog._glog_fields and HeaderRuns.of, worked out line by line. */
static PyObject *glog_headers(PyObject *self, PyObject *args) {
    Py_buffer views_view, out_view[OUTPUTS];
    PyObject *data_obj, *outs_obj;
    long long year;
    if (!PyArg_ParseTuple(args, "y*O!LO!", &views_view, &PyTuple_Type, &data_obj, &year, &PyTuple_Type, &outs_obj))
        return NULL;
    Py_ssize_t buffers = 0, held = 0;
    PyObject *unknown = NULL;
    uint32_t *unknown_rows = NULL;
    Py_buffer *data = hold_buffers(data_obj, &buffers);
    if (!data)
        goto done;
    if (views_view.len % 16 || PyTuple_GET_SIZE(outs_obj) != OUTPUTS) {
        PyErr_SetString(PyExc_ValueError, "glog_headers: views of 16 bytes, and a buffer an output");
        goto done;
    }
    Py_ssize_t n = views_view.len / 16, bits = (n + 7) / 8;
    const Py_ssize_t sizes[OUTPUTS] = {16 * n, bits, bits, 16 * n, 8 * n, bits, 4 * n, 16 * n, 8 * n, bits};
    uint8_t *o[OUTPUTS];
    for (; held < OUTPUTS; held++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(outs_obj, held), &out_view[held], PyBUF_WRITABLE) < 0)
            goto done;
        if (out_view[held].len != sizes[held]) {
            held++;
            PyErr_SetString(PyExc_ValueError, "glog_headers: an output buffer of the wrong size");
            goto done;
        }
        o[held] = out_view[held].buf;
    }
    unknown_rows = PyMem_Malloc((size_t)(n ? n : 1) * 4);
    if (!unknown_rows) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t unknowns = 0;
    int bad = 0;
    const uint8_t *views = views_view.buf;
    Py_BEGIN_ALLOW_THREADS
    const int bitmaps[] = {FIRSTS, GLOG, SRC_AT_VALID, TS_VALID};
    for (int k = 0; k < 4; k++)  /* (the bitmaps cleared; each line's values are written below) */
        memset(o[bitmaps[k]], 0, (size_t)bits);
    const uint8_t *prev = NULL;
    int32_t prev_len = -1;  /* (-1: no line before) */
    struct header header = {0};
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t *view = views + 16 * i;
        int32_t len;
        const uint8_t *s = string_at(views, i, data, buffers, &len);
        if (!s) {
            bad = 1;
            break;
        }
        const uint8_t *bracket = memchr(s, ']', (size_t)len);
        int32_t close = bracket ? (int32_t)(bracket - s) : -1;
        /* the "]" and the one character after it (a line with no "]" is its own head) */
        int32_t head_len = bracket ? close + 1 + char_end(s + close + 1, len - close - 1) : len;
        sub_view(o[HEADS] + 16 * i, view, s, 0, head_len);
        int new_run = prev_len < 0 || head_len != prev_len || memcmp(s, prev, (size_t)head_len) != 0;
        if (new_run)
            set_bit(o[FIRSTS], i);
        prev = s;
        prev_len = head_len;
        /* a line of a run (the same head as the line before) has the same header: parsed once a run */
        if (new_run)
            header = parse_header(s, len, bracket ? close : -1, head_len, year);
        /* (a NULL row holds zeros, as a column Polars made would) */
        ((int64_t *)o[SRC_AT])[i] = ((int64_t *)o[TS])[i] = 0;
        if (!header.glog) {
            memset(o[LEVELS] + 16 * i, 0, 16);
            memset(o[MSGS] + 16 * i, 0, 16);
            ((uint32_t *)o[SRC_END])[i] = 0;
            continue;
        }
        set_bit(o[GLOG], i);
        sub_view(o[LEVELS] + 16 * i, view, s, header.start, header.start + 1);
        ((uint32_t *)o[SRC_END])[i] = (uint32_t)header.close;
        sub_view(o[MSGS] + 16 * i, view, s, header.msg_at, len);
        if (header.time_end < 0)
            continue;  /* (no time's end: src_at and ts are NULL, as in _glog_fields) */
        ((int64_t *)o[SRC_AT])[i] = header.time_end;
        set_bit(o[SRC_AT_VALID], i);
        if (header.time_known) {
            ((int64_t *)o[TS])[i] = header.micros;
            set_bit(o[TS_VALID], i);
        } else {
            unknown_rows[unknowns++] = (uint32_t)i;
        }
    }
    Py_END_ALLOW_THREADS
    if (bad)
        PyErr_SetString(PyExc_ValueError, "glog_headers: a view outside its buffer");
    else
        unknown = PyBytes_FromStringAndSize((const char *)unknown_rows, unknowns * 4);
done:
    PyMem_Free(unknown_rows);
    for (Py_ssize_t k = 0; k < held; k++)
        PyBuffer_Release(&out_view[k]);
    if (data)
        release_buffers(data, buffers);
    PyBuffer_Release(&views_view);
    return unknown;
}

/* ---- records of several lines (parsers/dynamo.py: a compile record is the lines of its stream from its start) ---- */

static inline uint64_t mix(uint64_t h) {  /* (a 64-bit finalizer: murmur3's) */
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

/* row_ids(columns) -> bytes: for the rows of ``columns`` (a tuple of buffers of uint32, each as
 * long as the others: a row's values, one a column), a number (uint32) a row, equal for equal
 * rows, numbered from 0 in the order each row first appears (lines.key_ids, for integer keys). */
static inline int same_row(const Py_buffer *col, Py_ssize_t k, Py_ssize_t i, Py_ssize_t j) {
    for (Py_ssize_t c = 0; c < k; c++) {
        if (((const uint32_t *)col[c].buf)[i] != ((const uint32_t *)col[c].buf)[j])
            return 0;
    }
    return 1;
}

static PyObject *row_ids(PyObject *self, PyObject *args) {
    PyObject *columns;
    if (!PyArg_ParseTuple(args, "O!", &PyTuple_Type, &columns))
        return NULL;
    Py_ssize_t k = PyTuple_GET_SIZE(columns), got = 0, n = 0;
    Py_buffer *col = PyMem_Calloc(k ? k : 1, sizeof(Py_buffer));
    PyObject *out = NULL;
    uint32_t *table = NULL;
    if (!col)
        return PyErr_NoMemory();
    for (; got < k; got++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(columns, got), &col[got], PyBUF_SIMPLE) < 0)
            goto done;
        if (col[got].len % 4 || (got && col[got].len != col[0].len)) {
            got++;
            PyErr_SetString(PyExc_ValueError, "row_ids: columns of uint32, all as long");
            goto done;
        }
    }
    n = k ? col[0].len / 4 : 0;
    if (n >= UINT32_MAX / 2) {
        PyErr_SetString(PyExc_ValueError, "row_ids: too many rows");
        goto done;
    }
    Py_ssize_t size = 16;
    while (size < 2 * n)
        size <<= 1;
    table = PyMem_Malloc((size_t)size * 4);  /* each slot: 1 + the first row of a key, 0 where empty */
    out = PyBytes_FromStringAndSize(NULL, n * 4);
    if (!table || !out) {
        Py_CLEAR(out);
        PyErr_NoMemory();
        goto done;
    }
    memset(table, 0, (size_t)size * 4);
    uint32_t *ids = (uint32_t *)PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    uint32_t next = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i && same_row(col, k, i, i - 1)) {  /* (rows of one key most often follow one another: no look-up) */
            ids[i] = ids[i - 1];
            continue;
        }
        uint64_t h = 0x9e3779b97f4a7c15ULL;
        for (Py_ssize_t c = 0; c < k; c++)
            h = mix(h ^ ((const uint32_t *)col[c].buf)[i]);
        Py_ssize_t slot = (Py_ssize_t)(h & (uint64_t)(size - 1));
        for (;; slot = (slot + 1) & (size - 1)) {
            uint32_t held = table[slot];
            if (!held) {  /* a new key: this row is its first */
                table[slot] = (uint32_t)i + 1;
                ids[i] = next++;
                break;
            }
            if (same_row(col, k, i, held - 1)) {
                ids[i] = ids[held - 1];
                break;
            }
        }
    }
    Py_END_ALLOW_THREADS
done:
    PyMem_Free(table);
    for (Py_ssize_t c = 0; c < got; c++)
        PyBuffer_Release(&col[c]);
    PyMem_Free(col);
    return out;
}

/* Each line's block (``block``: -1 for a line of none, or one not ``taken``, where given): a block is
 * a start (``start``, a byte a line) and the taken lines of its stream (``stream``, of ``streams``)
 * after it, up to the stream's next start. Writes each block's start line into ``first`` and makes
 * ``offset`` (blocks + 1 of them, zeroed) where each block's lines begin, and end, block after block;
 * ``current`` is room for a number a stream. Returns how many lines the blocks hold. */
static Py_ssize_t assign_blocks(Py_ssize_t n, const uint8_t *taken, const uint8_t *start, const uint32_t *stream,
                                uint32_t streams, int32_t *current, uint32_t *first, int64_t *offset,
                                Py_ssize_t blocks, int32_t *block) {
    Py_ssize_t members = 0;
    for (uint32_t s = 0; s < streams; s++)
        current[s] = -1;
    int32_t b = 0;
    for (Py_ssize_t i = 0; i < n; i++) {  /* each line's block, and how many lines each has */
        block[i] = -1;
        if (taken && !taken[i])
            continue;
        if (start[i]) {
            first[b] = (uint32_t)i;
            current[stream[i]] = b++;
        }
        block[i] = current[stream[i]];
        if (block[i] >= 0) {
            offset[block[i] + 1]++;
            members++;
        }
    }
    for (Py_ssize_t j = 0; j < blocks; j++)
        offset[j + 1] += offset[j];
    return members;
}

/* The blocks' lines placed block after block (``assign_blocks``' ``block`` and ``offset``), each as its
 * ``value`` (the line's own number where NULL). */
static void place_blocks(Py_ssize_t n, const int32_t *block, int64_t *offset, Py_ssize_t blocks,
                         const uint32_t *value, uint32_t *placed) {
    for (Py_ssize_t i = 0; i < n; i++) {  /* (offset[j] moves to block j's end as its lines are placed) */
        if (block[i] >= 0)
            placed[offset[block[i]]++] = value ? value[i] : (uint32_t)i;
    }
    for (Py_ssize_t j = blocks; j > 0; j--)  /* (and back to its beginning) */
        offset[j] = offset[j - 1];
    offset[0] = 0;
}

/* (firsts, offsets, lines) of the ``blocks`` blocks of ``assign_blocks``, their lines placed block after
 * block as their ``value``s (their own numbers where NULL); ``current`` and ``block`` are its room. */
static PyObject *blocks_of(Py_ssize_t n, const uint8_t *taken, const uint8_t *start, const uint32_t *stream,
                           uint32_t streams, int32_t *current, int32_t *block, Py_ssize_t blocks,
                           const uint32_t *value) {
    PyObject *firsts = PyBytes_FromStringAndSize(NULL, blocks * 4);
    PyObject *offsets = PyBytes_FromStringAndSize(NULL, (blocks + 1) * 8), *lines = NULL, *result = NULL;
    if (!firsts || !offsets)
        goto done;
    uint32_t *first = (uint32_t *)PyBytes_AS_STRING(firsts);
    int64_t *offset = (int64_t *)PyBytes_AS_STRING(offsets);
    memset(offset, 0, (size_t)(blocks + 1) * 8);
    Py_ssize_t members;
    Py_BEGIN_ALLOW_THREADS
    members = assign_blocks(n, taken, start, stream, streams, current, first, offset, blocks, block);
    Py_END_ALLOW_THREADS
    lines = PyBytes_FromStringAndSize(NULL, members * 4);
    if (!lines)
        goto done;
    place_blocks(n, block, offset, blocks, value, (uint32_t *)PyBytes_AS_STRING(lines));
    result = Py_BuildValue("(OOO)", firsts, offsets, lines);
done:
    Py_XDECREF(firsts);
    Py_XDECREF(offsets);
    Py_XDECREF(lines);
    return result;
}

/* stream_blocks(streams, starts) -> (firsts, offsets, order): lines (in order) each of a stream
 * (``streams``: uint32, numbered from 0) and each a start of a block or not (``starts``: a byte
 * each); a block is a start and the lines of its stream after it, up to the stream's next start
 * (a stream's lines before its first start are of none). ``firsts``: each block's start line
 * (uint32), the blocks in the order they start; ``order``: the lines of the blocks (uint32), block
 * after block, each block's in line order; ``offsets``: where each block's lines begin in
 * ``order`` (int64), and its end. One pass to say each line's block, one to count, one to place. */
static PyObject *stream_blocks(PyObject *self, PyObject *args) {
    Py_buffer streams, starts;
    if (!PyArg_ParseTuple(args, "y*y*", &streams, &starts))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = streams.len / 4, blocks = 0;
    int32_t *block = NULL, *current = NULL;
    if (streams.len % 4 || starts.len != n || n >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "stream_blocks: a uint32 stream and a start byte a line");
        goto done;
    }
    const uint32_t *stream = streams.buf;
    const uint8_t *start = starts.buf;
    uint32_t count = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (stream[i] >= count)
            count = stream[i] + 1;
        blocks += start[i] != 0;
    }
    block = PyMem_Malloc((size_t)(n ? n : 1) * 4);
    current = PyMem_Malloc((size_t)(count ? count : 1) * 4);
    if (!block || !current) {
        PyErr_NoMemory();
        goto done;
    }
    result = blocks_of(n, NULL, start, stream, count, current, block, blocks, NULL);
done:
    PyMem_Free(block);
    PyMem_Free(current);
    PyBuffer_Release(&streams);
    PyBuffer_Release(&starts);
    return result;
}

/* message_blocks(selected, messages, file_no, rank, rank_null, tee, emitter, art, art_null, cid, start)
 * -> (firsts, offsets, members): dynamo's records (parsers/dynamo.py: _blocks_in_one_pass, what
 * _blocks makes of the lines _dynamo_lines filters out) from a frame's rows in one pass. A row (each of these a row: uint32 unless said) is a line of a record where ``selected``
 * (a byte); its message's number is ``messages``'; ``file_no``, ``rank`` with ``rank_null`` (a byte),
 * ``tee`` (0, 1, or 2 for NULL) say where it was logged, ``emitter`` the number of the line of torch
 * that logged it (UINT32_MAX: none). A message (each of these a message) has an artifact
 * (``art``, its number; ``art_null``, a byte: it has none), a compile id (``cid``, its number) and
 * a ``start`` byte: 0, it starts no block; 1, it starts one; 2, it starts one and is the head of
 * the `Tensor.item()` warning; 3, it is that warning's tail, which starts a block only where the
 * stream's last start before it is not such a head (else it continues the head's block). A
 * selected row's stream: its file, rank, tee flag, its message's compile id and, where the message
 * has no artifact and the row has an emitter, that emitter, else the artifact. Blocks as
 * stream_blocks': ``firsts``, each block's start row (uint32), the blocks in the order they start;
 * ``members``, the message numbers of each block's rows (uint32), block after block, in row order;
 * ``offsets``, where each block's members begin (int64), and end. */
#define MESSAGE_KEY 7
static inline void message_key(uint32_t *key, Py_ssize_t i, const uint32_t *const *row, const uint8_t *rank_null,
                               const uint32_t *messages, const uint32_t *art, const uint8_t *art_null,
                               const uint32_t *cid) {
    uint32_t m = messages[i];
    int emitted = art_null[m] && row[3][i] != UINT32_MAX;
    key[0] = row[0][i];  /* file_no */
    key[1] = row[1][i];  /* rank */
    key[2] = rank_null[i];
    key[3] = row[2][i];  /* tee */
    key[4] = cid[m];
    key[5] = (uint32_t)emitted;
    key[6] = emitted ? row[3][i] : art[m];
}

static PyObject *message_blocks(PyObject *self, PyObject *args) {
    Py_buffer in[11];
    int got = 0;
    PyObject *result = NULL;
    uint32_t *stream = NULL, *table = NULL, *first_of = NULL;
    int32_t *block = NULL, *current = NULL;
    uint8_t *starts = NULL;
    int8_t *after_head = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*y*y*y*", &in[0], &in[1], &in[2], &in[3], &in[4], &in[5], &in[6],
                          &in[7], &in[8], &in[9], &in[10]))
        return NULL;
    got = 11;
    Py_ssize_t n = in[0].len, k = in[8].len, blocks = 0, count = 0;
    if (n >= INT32_MAX / 2 || in[1].len != 4 * n || in[2].len != 4 * n || in[3].len != 4 * n || in[4].len != n
        || in[5].len != 4 * n || in[6].len != 4 * n || in[7].len != 4 * k || in[9].len != 4 * k || in[10].len != k) {
        PyErr_SetString(PyExc_ValueError, "message_blocks: the rows' columns all as long, the messages' too");
        goto done;
    }
    const uint8_t *selected = in[0].buf, *rank_null = in[4].buf, *art_null = in[8].buf, *start = in[10].buf;
    const uint32_t *messages = in[1].buf, *art = in[7].buf, *cid = in[9].buf;
    const uint32_t *const row[4] = {in[2].buf, in[3].buf, in[5].buf, in[6].buf};  /* file_no, rank, tee, emitter */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!selected[i])
            continue;
        if (messages[i] >= (uint64_t)k) {
            PyErr_SetString(PyExc_ValueError, "message_blocks: a row's message is not one of the messages");
            goto done;
        }
        count++;
    }
    Py_ssize_t size = 16;
    while (size < 2 * count)
        size <<= 1;
    stream = PyMem_Malloc((size_t)(n ? n : 1) * 4);
    block = PyMem_Malloc((size_t)(n ? n : 1) * 4);
    first_of = PyMem_Malloc((size_t)(count ? count : 1) * 4);  /* each stream's first row */
    current = PyMem_Malloc((size_t)(count ? count : 1) * 4);
    table = PyMem_Calloc((size_t)size, 4);  /* each slot: 1 + a stream's number, 0 where empty */
    starts = PyMem_Malloc((size_t)(n ? n : 1));
    after_head = PyMem_Malloc((size_t)(count ? count : 1));  /* a stream's last start: an item() head */
    if (!stream || !block || !first_of || !current || !table || !starts || !after_head) {
        PyErr_NoMemory();
        goto done;
    }
    uint32_t streams = 0, key[MESSAGE_KEY], other[MESSAGE_KEY], previous[MESSAGE_KEY];
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t last = -1;
    for (Py_ssize_t i = 0; i < n; i++) {  /* each selected row's stream, numbered as they first appear */
        if (!selected[i])
            continue;
        message_key(key, i, row, rank_null, messages, art, art_null, cid);
        if (last >= 0 && memcmp(key, previous, sizeof key) == 0) {  /* (a record's rows follow one another) */
            stream[i] = stream[last];
            last = i;
            continue;
        }
        uint64_t h = 0x9e3779b97f4a7c15ULL;
        for (int c = 0; c < MESSAGE_KEY; c++)
            h = mix(h ^ key[c]);
        for (Py_ssize_t slot = (Py_ssize_t)(h & (uint64_t)(size - 1));; slot = (slot + 1) & (size - 1)) {
            uint32_t held = table[slot];
            if (!held) {
                first_of[streams] = (uint32_t)i;
                table[slot] = ++streams;
                stream[i] = streams - 1;
                break;
            }
            message_key(other, first_of[held - 1], row, rank_null, messages, art, art_null, cid);
            if (memcmp(key, other, sizeof key) == 0) {
                stream[i] = held - 1;
                break;
            }
        }
        memcpy(previous, key, sizeof key);
        last = i;
    }
    memset(after_head, 0, (size_t)(count ? count : 1));
    for (Py_ssize_t i = 0; i < n; i++) {  /* which rows start a block */
        starts[i] = 0;
        if (!selected[i])
            continue;
        uint8_t kind = start[messages[i]];
        if (kind == 1 || kind == 2)
            after_head[stream[i]] = kind == 2;
        starts[i] = kind == 1 || kind == 2 || (kind == 3 && !after_head[stream[i]]);
        blocks += starts[i];
    }
    Py_END_ALLOW_THREADS
    result = blocks_of(n, selected, starts, stream, streams, current, block, blocks, messages);
done:
    PyMem_Free(stream);
    PyMem_Free(block);
    PyMem_Free(first_of);
    PyMem_Free(current);
    PyMem_Free(table);
    PyMem_Free(starts);
    PyMem_Free(after_head);
    for (int j = 0; j < got; j++)
        PyBuffer_Release(&in[j]);
    return result;
}

/* ---- a column's strings numbered (parsers/columns.py: dictionary) ---- */

/* 64 x 64 -> 128-bit multiply, its halves folded (wyhash's "mum"). */
static inline uint64_t mum(uint64_t a, uint64_t b) {
#if defined(__SIZEOF_INT128__)
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
#else
    uint64_t lo = a * b, hi = ((a >> 32) * (b >> 32)) + (((a >> 32) * (b & 0xffffffffULL)) >> 32)
                  + (((a & 0xffffffffULL) * (b >> 32)) >> 32);
    return lo ^ hi;
#endif
}

static inline uint64_t read8(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline uint64_t read4(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* A hash of a string's bytes, wyhash's way (16 bytes a multiply, three lanes past 48): it only
 * sorts strings into slots; two are the same string only where their bytes are. */
static uint64_t string_hash(const uint8_t *p, int32_t len) {
    const uint64_t s0 = 0xa0761d6478bd642fULL, s1 = 0xe7037ed1a0b428dbULL, s2 = 0x8ebc6af09c88c6e3ULL;
    uint64_t seed = s0 ^ (uint64_t)len, a, b;
    if (len <= 16) {
        if (len >= 4) {
            a = (read4(p) << 32) | read4(p + ((len >> 3) << 2));
            b = (read4(p + len - 4) << 32) | read4(p + len - 4 - ((len >> 3) << 2));
        } else if (len > 0) {
            a = ((uint64_t)p[0] << 16) | ((uint64_t)p[len >> 1] << 8) | p[len - 1];
            b = 0;
        } else {
            a = b = 0;
        }
    } else {
        int32_t left = len;
        if (left > 48) {
            uint64_t lane1 = seed, lane2 = seed;
            do {
                seed = mum(read8(p) ^ s1, read8(p + 8) ^ seed);
                lane1 = mum(read8(p + 16) ^ s2, read8(p + 24) ^ lane1);
                lane2 = mum(read8(p + 32) ^ s0, read8(p + 40) ^ lane2);
                p += 48;
                left -= 48;
            } while (left > 48);
            seed ^= lane1 ^ lane2;
        }
        while (left > 16) {
            seed = mum(read8(p) ^ s1, read8(p + 8) ^ seed);
            p += 16;
            left -= 16;
        }
        a = read8(p + left - 16);
        b = read8(p + left - 8);
    }
    return mum(s1 ^ (uint64_t)len, mum(a ^ s1, b ^ seed));
}

/* list_ids(offsets, values) -> bytes: for each list of a list column (its int64 ``offsets``, n + 1
 * of them, into its uint32 ``values``), a number (uint32), equal for lists of the same values in the
 * same order, numbered from 0 in the order each first appears (dynamo.py: the compile records
 * whose lines say the same, one per distinct record). */
static PyObject *list_ids(PyObject *self, PyObject *args) {
    Py_buffer off_view, val_view;
    if (!PyArg_ParseTuple(args, "y*y*", &off_view, &val_view))
        return NULL;
    PyObject *out = NULL;
    uint32_t *table = NULL, *first = NULL;  /* a slot: 1 + a distinct list's number; each one's first list */
    uint64_t *hashes = NULL;
    Py_ssize_t n = off_view.len / 8 - 1, values = val_view.len / 4;
    const int64_t *offsets = off_view.buf;
    const uint32_t *v = val_view.buf;
    if (off_view.len % 8 || val_view.len % 4 || n < 0 || n >= UINT32_MAX / 4) {
        PyErr_SetString(PyExc_ValueError, "list_ids: int64 offsets, one more than the lists, and uint32 values");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (offsets[i] < 0 || offsets[i] > offsets[i + 1] || offsets[i + 1] > values ||
            offsets[i + 1] - offsets[i] > INT32_MAX / 4) {
            PyErr_SetString(PyExc_ValueError, "list_ids: an offset outside the values");
            goto done;
        }
    }
    Py_ssize_t size = 16;
    while (size < 2 * n)
        size <<= 1;
    table = PyMem_Calloc((size_t)size, 4);
    first = PyMem_Malloc((size_t)(n ? n : 1) * 4);
    hashes = PyMem_Malloc((size_t)(n ? n : 1) * 8);
    out = PyBytes_FromStringAndSize(NULL, n * 4);
    if (!table || !first || !hashes || !out) {
        Py_CLEAR(out);
        PyErr_NoMemory();
        goto done;
    }
    uint32_t *ids = (uint32_t *)PyBytes_AS_STRING(out), distinct = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint32_t *list = v + offsets[i];
        int64_t len = offsets[i + 1] - offsets[i];
        uint64_t h = string_hash((const uint8_t *)list, (int32_t)(len * 4));
        Py_ssize_t slot = (Py_ssize_t)(h & (uint64_t)(size - 1));
        for (;; slot = (slot + 1) & (size - 1)) {
            uint32_t held = table[slot];
            if (!held) {  /* a new list: this is its first */
                first[distinct] = (uint32_t)i;
                hashes[distinct] = h;
                ids[i] = distinct;
                table[slot] = ++distinct;
                break;
            }
            Py_ssize_t j = first[held - 1];
            if (hashes[held - 1] == h && offsets[j + 1] - offsets[j] == len &&
                memcmp(v + offsets[j], list, (size_t)len * 4) == 0) {
                ids[i] = held - 1;
                break;
            }
        }
    }
    Py_END_ALLOW_THREADS
done:
    PyMem_Free(table);
    PyMem_Free(first);
    PyMem_Free(hashes);
    PyBuffer_Release(&off_view);
    PyBuffer_Release(&val_view);
    return out;
}

/* view_dictionary(views, data, valid, offset, codes) -> firsts: for each string of a view column
 * (Arrow string views ``views`` into the buffers ``data``; ``valid`` its validity bitmap, whose bit
 * ``offset`` is the first string's, or None), writes into ``codes`` (writable, uint32 a string) its
 * number among the distinct strings, numbered from 0 as they first appear (0 where NULL); returns
 * each distinct string's first row (uint32), in the order of their numbers: columns.dictionary's
 * numbering, in one pass and a hash table of the distinct strings alone (each string hashed once,
 * compared whole only with a distinct one of the same hash and length). A string is first compared
 * with the one that followed the string before it the last time that one was met: the lines of a
 * record logged again and again (a graph break every step, a stack dumped by every rank) come in the
 * same order, and each is then told by one compare, not a hash and a look-up. */
static PyObject *view_dictionary(PyObject *self, PyObject *args) {
    Py_buffer views_view, valid_view, codes_view;
    PyObject *data_obj, *valid_obj, *codes_obj, *result = NULL;
    Py_ssize_t offset;
    int have_valid = 0, have_codes = 0;
    if (!PyArg_ParseTuple(args, "y*O!OnO", &views_view, &PyTuple_Type, &data_obj, &valid_obj, &offset, &codes_obj))
        return NULL;
    Py_ssize_t buffers = 0, n = views_view.len / 16;
    /* (the raw allocator: the tables grow where the GIL is let go) */
    uint32_t *table = NULL, *first = NULL;  /* a slot: 1 + a distinct string's number, 0 where empty */
    uint64_t *hashes = NULL;                /* each distinct string's hash */
    uint32_t *after = NULL;                 /* each distinct string's: 1 + the number of the one after it last, 0: none */
    Py_buffer *data = hold_buffers(data_obj, &buffers);
    if (!data)
        goto done;
    if (valid_obj != Py_None) {
        if (PyObject_GetBuffer(valid_obj, &valid_view, PyBUF_SIMPLE) < 0)
            goto done;
        have_valid = 1;
    }
    if (PyObject_GetBuffer(codes_obj, &codes_view, PyBUF_WRITABLE) < 0)
        goto done;
    have_codes = 1;
    if (views_view.len % 16 || n >= UINT32_MAX / 4 || offset < 0 || codes_view.len != n * 4
        || (have_valid && valid_view.len < (offset + n + 7) / 8)) {
        PyErr_SetString(PyExc_ValueError, "view_dictionary: views of 16 bytes, a validity bit and a uint32 code each");
        goto done;
    }
    Py_ssize_t size = 1024, distinct = 0, capacity = 256;
    table = PyMem_RawCalloc((size_t)size, 4);
    first = PyMem_RawMalloc((size_t)capacity * 4);
    hashes = PyMem_RawMalloc((size_t)capacity * 8);
    after = PyMem_RawCalloc((size_t)capacity, 4);
    if (!table || !first || !hashes || !after) {
        PyErr_NoMemory();
        goto done;
    }
    uint32_t *code = codes_view.buf;
    const uint8_t *views = views_view.buf, *valid = have_valid ? valid_view.buf : NULL;
    int bad = 0, no_memory = 0;
    int64_t before = -1;  /* the number of the string before (-1: none, or a NULL) */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        code[i] = 0;
        if (valid && !(valid[(offset + i) >> 3] >> ((offset + i) & 7) & 1)) {
            before = -1;
            continue;
        }
        int32_t len;
        const uint8_t *bytes = string_at(views, i, data, buffers, &len);
        if (!bytes) {
            bad = 1;
            break;
        }
        if (before >= 0 && after[before]) {  /* the string that followed the one before, the last time */
            uint32_t guess = after[before] - 1;
            const uint8_t *other = views + 16 * first[guess];
            int32_t other_len;
            memcpy(&other_len, other, 4);
            if (other_len == len && memcmp(view_bytes(other, data, buffers, len), bytes, (size_t)len) == 0) {
                code[i] = guess;
                before = guess;
                continue;
            }
        }
        uint64_t h = string_hash(bytes, len);
        Py_ssize_t slot = (Py_ssize_t)(h & (uint64_t)(size - 1));
        for (;; slot = (slot + 1) & (size - 1)) {
            uint32_t held = table[slot];
            if (!held)
                break;
            if (hashes[held - 1] != h)
                continue;
            const uint8_t *other = views + 16 * first[held - 1];
            int32_t other_len;
            memcpy(&other_len, other, 4);
            if (other_len == len && memcmp(view_bytes(other, data, buffers, len), bytes, (size_t)len) == 0)
                break;
        }
        if (table[slot]) {
            code[i] = table[slot] - 1;
            if (before >= 0)
                after[before] = code[i] + 1;
            before = code[i];
            continue;
        }
        if (distinct == capacity) {
            uint32_t *more_first = PyMem_RawRealloc(first, (size_t)capacity * 2 * 4);
            if (more_first)
                first = more_first;
            uint64_t *more_hashes = more_first ? PyMem_RawRealloc(hashes, (size_t)capacity * 2 * 8) : NULL;
            if (more_hashes)
                hashes = more_hashes;
            uint32_t *more_after = more_hashes ? PyMem_RawRealloc(after, (size_t)capacity * 2 * 4) : NULL;
            if (!more_after) {
                no_memory = 1;
                break;
            }
            after = more_after;
            memset(after + capacity, 0, (size_t)capacity * 4);
            capacity *= 2;
        }
        first[distinct] = (uint32_t)i;
        hashes[distinct] = h;
        code[i] = (uint32_t)distinct;
        if (before >= 0)
            after[before] = code[i] + 1;
        before = code[i];
        table[slot] = (uint32_t)++distinct;
        if (distinct * 2 > size) {  /* (half full at most: the table doubles, each string slotted again) */
            uint32_t *bigger = PyMem_RawCalloc((size_t)size * 2, 4);
            if (!bigger) {
                no_memory = 1;
                break;
            }
            size *= 2;
            for (Py_ssize_t d = 0; d < distinct; d++) {
                Py_ssize_t at = (Py_ssize_t)(hashes[d] & (uint64_t)(size - 1));
                while (bigger[at])
                    at = (at + 1) & (size - 1);
                bigger[at] = (uint32_t)d + 1;
            }
            PyMem_RawFree(table);
            table = bigger;
        }
    }
    Py_END_ALLOW_THREADS
    if (no_memory)
        PyErr_NoMemory();
    else if (bad)
        PyErr_SetString(PyExc_ValueError, "view_dictionary: a view outside its buffer");
    else
        result = PyBytes_FromStringAndSize((const char *)first, distinct * 4);
done:
    PyMem_RawFree(table);
    PyMem_RawFree(first);
    PyMem_RawFree(hashes);
    PyMem_RawFree(after);
    if (have_valid)
        PyBuffer_Release(&valid_view);
    if (have_codes)
        PyBuffer_Release(&codes_view);
    if (data)
        release_buffers(data, buffers);
    PyBuffer_Release(&views_view);
    return result;
}

static PyMethodDef methods[] = {
    {"view_dictionary", view_dictionary, METH_VARARGS,
     "view_dictionary(views, data, valid, offset, codes) -> each distinct string's first row; its number into codes"},
    {"row_ids", row_ids, METH_VARARGS, "row_ids(columns) -> uint32 number a row, equal for equal rows"},
    {"list_ids", list_ids, METH_VARARGS, "list_ids(offsets, values) -> uint32 number a list, equal for equal lists"},
    {"stream_blocks", stream_blocks, METH_VARARGS, "stream_blocks(streams, starts) -> (firsts, offsets, order)"},
    {"message_blocks", message_blocks, METH_VARARGS,
     "message_blocks(selected, messages, file_no, rank, rank_null, tee, emitter, art, art_null, cid, start)"
     " -> (firsts, offsets, members)"},
    {"plain_line_starts", plain_line_starts, METH_VARARGS,
     "plain_line_starts(block) -> int64 offsets of the lines' starts, None if a byte is not ASCII or a CR"},
    {"tag_views", tag_views, METH_VARARGS,
     "tag_views(block, starts, tags, texts, max_chars) -> int32 tag index a line"},
    {"row_views", row_views, METH_VARARGS, "row_views(block, starts, rows, max_chars) -> views of those lines"},
    {"cut_views", cut_views, METH_VARARGS, "cut_views(block, starts, rows, cuts, texts, max_chars) -> None"},
    {"glog_headers", glog_headers, METH_VARARGS,
     "glog_headers(views, data, year, outs) -> rows of odd stamps; each line's header fields into outs"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_lines", .m_doc = "The byte work of splitting log lines and taking their headers apart.",
    .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__lines(void) { return PyModule_Create(&module); }
