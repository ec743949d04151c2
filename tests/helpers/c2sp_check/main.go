// An independent check of a trainledger team log (tests/integration/journal/test_c2sp_interop.py): the checkpoint's
// signed note opened by golang.org/x/mod/sumdb/note, every tile read through x/mod/sumdb/tlog's TileHashReader
// (which checks each tile against the signed tree hash), every entry of every bundle proven at its index with
// tlog.ProveRecord and tlog.CheckRecord, and each Ed25519 cosignature (tlog-cosignature, cosignature/v1) checked
// with crypto/ed25519 over the message the spec defines. x/mod is the Go team's own implementation, from which the
// C2SP signed-note and tlog-tiles formats were written down; Debian ships it (golang-golang-x-mod-dev).
//
//	c2sp_check LOGDIR LOG_VKEY [WITNESS_NAME=BASE64_ED25519_KEY ...]
//
// Prints "ok SIZE ENTRIES COSIGNATURES" and exits 0, or prints why and exits 1.
package main

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

type folder struct{ dir string }

func (f folder) Height() int { return 8 }

// C2SP tlog-tiles paths are sumdb's without the height element: tile/L/N[.p/W], tile/entries/N[.p/W].
func (f folder) path(t tlog.Tile) string {
	p := t.Path()
	return strings.Replace(p, "tile/8/", "tile/", 1)
}

func (f folder) ReadTiles(tiles []tlog.Tile) ([][]byte, error) {
	out := make([][]byte, len(tiles))
	for i, t := range tiles {
		b, err := os.ReadFile(filepath.Join(f.dir, f.path(t)))
		if err != nil {
			return nil, err
		}
		out[i] = b
	}
	return out, nil
}

func (f folder) SaveTiles(tiles []tlog.Tile, data [][]byte) {}

func fail(format string, args ...any) {
	fmt.Printf(format+"\n", args...)
	os.Exit(1)
}

func main() {
	if len(os.Args) < 3 {
		fail("usage: c2sp_check LOGDIR LOG_VKEY [NAME=KEY ...]")
	}
	dir, vkey := os.Args[1], os.Args[2]
	msg, err := os.ReadFile(filepath.Join(dir, "checkpoint"))
	if err != nil {
		fail("checkpoint: %v", err)
	}
	v, err := note.NewVerifier(vkey)
	if err != nil {
		fail("log vkey: %v", err)
	}
	n, err := note.Open(msg, note.VerifierList(v))
	if err != nil {
		fail("checkpoint note: %v", err)
	}
	lines := strings.Split(n.Text, "\n")
	if len(lines) < 4 || lines[0] != v.Name() {
		fail("checkpoint text: origin %q, not %q", lines[0], v.Name())
	}
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil {
		fail("checkpoint size: %v", err)
	}
	rootb, err := base64.StdEncoding.DecodeString(lines[2])
	if err != nil || len(rootb) != 32 {
		fail("checkpoint root: not a base64 32-byte hash")
	}
	var root tlog.Hash
	copy(root[:], rootb)
	tree := tlog.Tree{N: size, Hash: root}
	hr := tlog.TileHashReader(tree, folder{dir})

	entries := 0
	for b := int64(0); b*256 < size; b++ {
		w := size - b*256
		t := tlog.Tile{H: 8, L: -1, N: b, W: 256}
		if w < 256 {
			t.W = int(w)
		}
		p := strings.Replace(t.Path(), "tile/8/data/", "tile/entries/", 1)
		data, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			fail("%s: %v", p, err)
		}
		for i := 0; i < t.W; i++ {
			if len(data) < 2 {
				fail("%s: truncated", p)
			}
			l := int(binary.BigEndian.Uint16(data))
			if len(data) < 2+l {
				fail("%s: an entry runs past the end", p)
			}
			entry := data[2 : 2+l]
			data = data[2+l:]
			idx := b*256 + int64(i)
			proof, err := tlog.ProveRecord(size, idx, hr)
			if err != nil {
				fail("entry %d: no proof from the tiles: %v", idx, err)
			}
			if err := tlog.CheckRecord(proof, size, root, idx, tlog.RecordHash(entry)); err != nil {
				fail("entry %d: %v", idx, err)
			}
			entries++
		}
		if len(data) != 0 {
			fail("%s: bytes after its %d entries", p, t.W)
		}
	}

	// cosignatures: cosignature/v1 lines by the named witnesses (key hash type 0x04)
	text := []byte(n.Text)
	cosigned := 0
	for _, arg := range os.Args[3:] {
		name, k, _ := strings.Cut(arg, "=")
		pub, err := base64.StdEncoding.DecodeString(k)
		if err != nil || len(pub) != 32 {
			fail("witness %s: not a base64 Ed25519 key", name)
		}
		h := sha256.Sum256(append(append([]byte(name+"\n"), 0x04), pub...))
		found := false
		for _, sig := range append(append([]note.Signature{}, n.Sigs...), n.UnverifiedSigs...) {
			if sig.Name != name || sig.Hash != binary.BigEndian.Uint32(h[:4]) {
				continue
			}
			raw, _ := base64.StdEncoding.DecodeString(sig.Base64)
			if len(raw) != 4+8+64 {
				fail("witness %s: a cosignature of %d bytes", name, len(raw))
			}
			ts := binary.BigEndian.Uint64(raw[4:12])
			m := append([]byte(fmt.Sprintf("cosignature/v1\ntime %d\n", ts)), text...)
			if !ed25519.Verify(ed25519.PublicKey(pub), m, raw[12:]) {
				fail("witness %s: the cosignature does not verify", name)
			}
			found = true
		}
		if !found {
			fail("witness %s: no cosignature", name)
		}
		cosigned++
	}
	fmt.Printf("ok %d %d %d\n", size, entries, cosigned)
}
