//go:build chunkserve_no_pkgconfig

package chunkserve

// With -tags chunkserve_no_pkgconfig: no pkg-config; the header and library directories come
// from CGO_CFLAGS and CGO_LDFLAGS (e.g. CGO_CFLAGS=-I<src>/capi/include
// CGO_LDFLAGS="-L<build>/lib -Wl,-rpath,<build>/lib").

// #cgo LDFLAGS: -lchunkserve
import "C"
