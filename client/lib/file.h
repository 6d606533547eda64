/*
 * Checkpoint files (.safetensors, .npz, .npy) in libtensord: what
 * file_import.c and file_export.c share. Internal; the API is
 * tensord_put_file() and tensord_get_file() in <tensord/tensord.h>.
 */
#ifndef TENSORD_CLIENT_FILE_H
#define TENSORD_CLIENT_FILE_H

#include <stdbool.h>
#include <stddef.h>

#include <tensord/tensord.h>

/* The format of path by its suffix (case-insensitive); TENSORD_FILE_AUTO when none. */
tensord_file_format td_file_format(const char *path);

/*
 * Maps a safetensors dtype ("F32", "F8_E4M3", "F4") to the DLPack type of
 * one element (lanes 1); -ENOTSUP when safetensors has no such name.
 */
int td_st_dtype_parse(const char *s, DLDataType *ret);

/*
 * The safetensors name of dt, and into *ret_lanes how many of its elements
 * one DLPack element holds (2 for torch's float4_e2m1fn_x2, else 1); NULL
 * when safetensors has none.
 */
const char *td_st_dtype_name(DLDataType dt, int *ret_lanes);

/*
 * 0 when prefix is empty or ends in a separator ('/', '.', '_', ':', '-');
 * else -EINVAL with the reason set (td_set_error), naming path, worded for
 * an import or an export.
 */
int td_prefix_check(const char *prefix, const char *path, bool export);

/*
 * s with bytes outside printable ASCII (and quotes, backslashes) as \xNN,
 * for names read from a file. Returns buf. (Paths are the caller's own and
 * go into messages as they are.)
 */
const char *td_file_esc(const char *s, char *buf, size_t len);

#endif /* TENSORD_CLIENT_FILE_H */
