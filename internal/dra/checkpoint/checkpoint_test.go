package checkpoint_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/internal/dra/checkpoint"
)

func sample() checkpoint.Claims {
	return checkpoint.Claims{
		"uid-1": {Namespace: "ns", Name: "c1", Devices: []checkpoint.Device{{
			Requests: []string{"jetties"}, Pool: "node-1", Device: "udma0", URMADevice: "udma0",
			ShareID: "share-1", Jetties: 100, CDIDeviceIDs: []string{"urma.openeuler.org/claim=uid-1-udma0"},
		}}},
	}
}

func TestSaveLoadRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), checkpoint.FileName)
	missing, err := checkpoint.Load(path)
	if !errors.Is(err, fs.ErrNotExist) || errors.Is(err, checkpoint.ErrUnusable) || missing != nil {
		t.Fatalf("Load of a missing file = %v, %v; want an error for which fs.ErrNotExist holds", missing, err)
	}
	if err := checkpoint.Save(path, sample()); err != nil {
		t.Fatal(err)
	}
	got, err := checkpoint.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, sample()) {
		t.Fatalf("loaded %+v, want %+v", got, sample())
	}
	// Replacing leaves no temporary files behind.
	if err := checkpoint.Save(path, checkpoint.Claims{}); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("directory holds %d entries after two saves, want 1", len(entries))
	}
	if got, _ := checkpoint.Load(path); len(got) != 0 {
		t.Fatalf("after saving an empty set: %v", got)
	}
}

// Whatever is wrong with a checkpoint that is there, Load says what and
// where, marks it unusable (the driver then moves it aside and rebuilds),
// and leaves the file as it was.
func TestLoadRefusesUnusableFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), checkpoint.FileName)
	if err := checkpoint.Save(path, sample()); err != nil {
		t.Fatal(err)
	}
	good, _ := os.ReadFile(path)
	for _, tc := range []struct {
		name, content, want string
	}{
		{"corrupted", strings.Replace(string(good), `"jetties": 100`, `"jetties": 900`, 1), "fails its checksum"},
		{"bit flip in the checksum", strings.Replace(string(good), `"checksum": "`, `"checksum": "0`, 1), "fails its checksum"},
		{"truncated", string(good[:len(good)/2]), "not valid JSON"},
		{"empty", "", "not valid JSON"},
		{"claims of the wrong shape", `{"version": 1, "checksum": "", "claims": []}`, "not valid JSON"},
		{"older version", strings.Replace(string(good), `"version": 1`, `"version": 0`, 1), "has version 0, this driver reads version 1"},
		{"without a version (older format)", `{"claims": {}}`, "has version 0"},
		{"newer version", strings.Replace(string(good), `"version": 1`, `"version": 7`, 1), "has version 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := checkpoint.Load(path)
			if !errors.Is(err, checkpoint.ErrUnusable) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("Load = %v, want ErrUnusable naming the file and %q", err, tc.want)
			}
			if after, _ := os.ReadFile(path); string(after) != tc.content {
				t.Fatal("an unusable checkpoint was changed by Load")
			}
		})
	}
	t.Run("unreadable", func(t *testing.T) {
		// A directory in its place: reading fails whoever runs the test
		// (permissions do not stop root).
		path := filepath.Join(t.TempDir(), checkpoint.FileName)
		if err := os.Mkdir(path, 0o700); err != nil {
			t.Fatal(err)
		}
		_, err := checkpoint.Load(path)
		if !errors.Is(err, checkpoint.ErrUnusable) || !strings.Contains(err.Error(), "read checkpoint "+path) {
			t.Fatalf("Load = %v, want ErrUnusable saying the file could not be read", err)
		}
	})
}

func TestMoveAsideKeepsTheNewestFew(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, checkpoint.FileName)
	base := time.Date(2026, 12, 3, 10, 15, 2, 5, time.FixedZone("CST", 8*3600))
	var names []string
	for i := range checkpoint.MaxMovedAside + 2 {
		content := fmt.Sprintf("broken %d", i)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		aside, err := checkpoint.MoveAside(path, base.Add(time.Duration(i)*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(aside); string(got) != content {
			t.Fatalf("%s holds %q, want the checkpoint moved there, %q", aside, got, content)
		}
		names = append(names, filepath.Base(aside))
	}
	// Named with the time, in UTC.
	if want := "checkpoint.json.unusable-20261203T021502.000000005Z"; names[0] != want {
		t.Errorf("first moved aside as %s, want %s", names[0], want)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the checkpoint is still at %s after MoveAside (%v)", path, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, e := range entries {
		kept = append(kept, e.Name())
	}
	if want := names[len(names)-checkpoint.MaxMovedAside:]; !slices.Equal(kept, want) {
		t.Errorf("directory holds %q, want the newest %d moved aside, %q", kept, checkpoint.MaxMovedAside, want)
	}
}

func TestMoveAsideOfAMissingFileFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), checkpoint.FileName)
	if aside, err := checkpoint.MoveAside(path, time.Now()); aside != "" || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path) {
		t.Fatalf("MoveAside of a missing file = %q, %v; want an error naming it", aside, err)
	}
}

func TestSaveIntoMissingDirectoryFails(t *testing.T) {
	err := checkpoint.Save(filepath.Join(t.TempDir(), "nope", checkpoint.FileName), sample())
	if err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("Save = %v, want an error naming the directory", err)
	}
}

func FuzzLoad(f *testing.F) {
	dir := f.TempDir()
	path := filepath.Join(dir, checkpoint.FileName)
	if err := checkpoint.Save(path, sample()); err != nil {
		f.Fatal(err)
	}
	good, _ := os.ReadFile(path)
	f.Add(good)
	f.Add([]byte(`{"version":1,"checksum":"","claims":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(t.TempDir(), checkpoint.FileName)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		claims, err := checkpoint.Load(p)
		if err != nil {
			return
		}
		// Whatever loads must save and load back the same.
		if err := checkpoint.Save(p, claims); err != nil {
			t.Fatal(err)
		}
		again, err := checkpoint.Load(p)
		if err != nil || !reflect.DeepEqual(again, claims) {
			t.Fatalf("round trip of a loaded checkpoint: %v, %v", again, err)
		}
	})
}

// A crash between creating Save's temporary file and renaming it leaves the
// file behind; RemoveLeftovers (at start) removes such leftovers, and only
// those: other files in the directory and the checkpoint itself stay.
func TestLoadRemovesLeftoverTemporaryFiles(t *testing.T) {
	for _, tc := range []struct {
		name       string
		checkpoint bool // whether a checkpoint exists besides the leftovers
	}{
		{"with a checkpoint", true},
		{"without a checkpoint", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, checkpoint.FileName)
			if tc.checkpoint {
				if err := checkpoint.Save(path, sample()); err != nil {
					t.Fatal(err)
				}
			}
			leftovers := []string{".checkpoint.json.123456.tmp", ".checkpoint.json.9.tmp"}
			kept := []string{"dra.sock", "checkpoint.json.broken", ".checkpoint.json.tmp", ".checkpoint.json..tmp", ".other.json.1.tmp", "x.checkpoint.json.1.tmp"}
			for _, name := range append(append([]string{}, leftovers...), kept...) {
				if err := os.WriteFile(filepath.Join(dir, name), []byte("{"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Mkdir(filepath.Join(dir, ".checkpoint.json.7.tmp"), 0o750); err != nil {
				t.Fatal(err)
			}
			kept = append(kept, ".checkpoint.json.7.tmp") // not a file Save writes
			if err := checkpoint.RemoveLeftovers(path); err != nil {
				t.Fatal(err)
			}
			if got, err := checkpoint.Load(path); tc.checkpoint && (err != nil || !reflect.DeepEqual(got, sample())) {
				t.Fatalf("loaded %+v, %v; want %+v", got, err, sample())
			}
			for _, name := range leftovers {
				if _, err := os.Lstat(filepath.Join(dir, name)); !os.IsNotExist(err) {
					t.Errorf("leftover %s still there after RemoveLeftovers (%v)", name, err)
				}
			}
			for _, name := range kept {
				if _, err := os.Lstat(filepath.Join(dir, name)); err != nil {
					t.Errorf("%s was removed by RemoveLeftovers: %v", name, err)
				}
			}
		})
	}
}

// writtenByV1 is a checkpoint as Save wrote it before the checksum was
// taken over the file's bytes; such files must keep loading.
const writtenByV1 = `{
  "version": 1,
  "checksum": "c321b819acbf153a8a26b6e34f47cd28d1eded4d20d66f6b46906eed7e0c1b90",
  "claims": {
    "uid-1": {
      "namespace": "ns",
      "name": "c1",
      "devices": [
        {
          "requests": [
            "jetties"
          ],
          "pool": "node-1",
          "device": "udma0",
          "urmaDevice": "udma0",
          "shareID": "share-1",
          "jetties": 100,
          "cdiDeviceIDs": [
            "urma.openeuler.org/claim=uid-1-udma0"
          ]
        }
      ]
    },
    "uid-2": {
      "namespace": "ns",
      "name": "c\u003c2\u003e\u0026",
      "devices": [
        {
          "requests": [
            "a",
            "b"
          ],
          "pool": "node-1",
          "device": "udma1",
          "urmaDevice": "udma1",
          "jetties": 0,
          "adminAccess": true,
          "cdiDeviceIDs": [
            "urma.openeuler.org/claim=uid-2-udma1"
          ]
        }
      ]
    }
  }
}
`

func writtenByV1Claims() checkpoint.Claims {
	c := sample()
	c["uid-2"] = checkpoint.Claim{Namespace: "ns", Name: "c<2>&", Devices: []checkpoint.Device{{
		Requests: []string{"a", "b"}, Pool: "node-1", Device: "udma1", URMADevice: "udma1", AdminAccess: true,
		CDIDeviceIDs: []string{"urma.openeuler.org/claim=uid-2-udma1"},
	}}}
	return c
}

// withChecksumOverClaims sets the checksum of a checkpoint to the one over
// its claims' compacted bytes, as a driver writing fields this one does not
// know would.
func withChecksumOverClaims(t *testing.T, content string) string {
	t.Helper()
	var f map[string]json.RawMessage
	if err := json.Unmarshal([]byte(content), &f); err != nil {
		t.Fatal(err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, f["claims"]); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(compact.Bytes())
	f["checksum"], _ = json.Marshal(hex.EncodeToString(sum[:]))
	out, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// A downgraded driver must read what a newer one wrote as long as the
// version is the same: fields it does not know are ignored, not a checksum
// failure. Files the earlier code wrote keep loading.
func TestLoadAcceptsFieldsItDoesNotKnow(t *testing.T) {
	withUnknown := strings.NewReplacer(
		`"name": "c1",`, `"name": "c1", "futureClaimField": {"x": [1, 2.5]},`,
		`"jetties": 100,`, `"jetties": 100, "futureDeviceField": "y",`,
	).Replace(writtenByV1)
	for _, tc := range []struct{ name, content string }{
		{"written by the earlier code", writtenByV1},
		{"unknown fields in a claim and a device", withChecksumOverClaims(t, withUnknown)},
		{"re-indented", withChecksumOverClaims(t, writtenByV1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), checkpoint.FileName)
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := checkpoint.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			if want := writtenByV1Claims(); !reflect.DeepEqual(got, want) {
				t.Fatalf("loaded %+v, want %+v", got, want)
			}
		})
	}
}
