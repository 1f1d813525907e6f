#ifndef PRESENCED_CHTTPPARSER_SHIM_H
#define PRESENCED_CHTTPPARSER_SHIM_H
// Debian's libhttp-parser-dev (Node.js's http-parser 2.9): HTTP/1.1 request parsing for the
// front door (WEB.md). It ships no pkg-config file, so the library is linked by name.
#include <http_parser.h>
#endif
