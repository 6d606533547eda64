/*
 * libtensord: the calling thread's last error message, behind
 * tensord_last_error(). Every failing call sets it with td_set_error().
 */
#include <stdarg.h>
#include <stdio.h>

#include "import.h"

static __thread char last_error[1024];

const char *tensord_last_error(void)
{
	return last_error;
}

int td_set_error(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(last_error, sizeof(last_error), fmt, ap);
	va_end(ap);
	return err;
}

void td_clear_error(void)
{
	last_error[0] = '\0';
}
