#include "flashdec.h"

#define FD_STR2(x) #x
#define FD_STR(x) FD_STR2(x)

extern "C" {

FD_API const char *fd_version_string(void) {
  return FD_STR(FD_VERSION_MAJOR) "." FD_STR(FD_VERSION_MINOR) "." FD_STR(FD_VERSION_PATCH);
}

FD_API uint32_t fd_version_number(void) {
  return FD_VERSION_NUMBER;
}

}  // extern "C"
