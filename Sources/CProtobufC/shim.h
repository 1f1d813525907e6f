#ifndef PRESENCED_CPROTOBUFC_SHIM_H
#define PRESENCED_CPROTOBUFC_SHIM_H
#include <protobuf-c/protobuf-c.h>
#endif
