//go:build !chunkserve_no_pkgconfig

package chunkserve

// The header and the library, for every cgo file of the package (cgo merges the flags of all of
// them): pkg-config's chunkserve.pc when installed, chunkserve-uninstalled.pc in a build tree.
// Build with -tags chunkserve_no_pkgconfig to use CGO_CFLAGS / CGO_LDFLAGS instead
// (link_flags.go).

// #cgo pkg-config: chunkserve
import "C"
