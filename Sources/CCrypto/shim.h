#ifndef PRESENCED_CCRYPTO_SHIM_H
#define PRESENCED_CCRYPTO_SHIM_H
#include <openssl/hmac.h>
#include <openssl/evp.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#endif
