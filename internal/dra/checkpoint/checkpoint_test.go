package checkpoint_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

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
	empty, err := checkpoint.Load(path)
	if err != nil || len(empty) != 0 {
		t.Fatalf("Load of a missing file = %v, %v; want empty, nil", empty, err)
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

func TestLoadRefusesDamagedFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), checkpoint.FileName)
	if err := checkpoint.Save(path, sample()); err != nil {
		t.Fatal(err)
	}
	good, _ := os.ReadFile(path)
	for _, tc := range []struct {
		name, content, want string
	}{
		{"edited", strings.Replace(string(good), `"jetties": 100`, `"jetties": 900`, 1), "checksum"},
		{"truncated", string(good[:len(good)/2]), "not valid JSON"},
		{"other version", strings.Replace(string(good), `"version": 1`, `"version": 7`, 1), "version 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := checkpoint.Load(path)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("Load = %v, want an error naming the file and %q", err, tc.want)
			}
			if after, _ := os.ReadFile(path); string(after) != tc.content {
				t.Fatal("a damaged checkpoint was changed by Load")
			}
		})
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
// file behind; the next Load (at start) removes such leftovers, and only
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
			got, err := checkpoint.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			if tc.checkpoint && !reflect.DeepEqual(got, sample()) {
				t.Fatalf("loaded %+v, want %+v", got, sample())
			}
			for _, name := range leftovers {
				if _, err := os.Lstat(filepath.Join(dir, name)); !os.IsNotExist(err) {
					t.Errorf("leftover %s still there after Load (%v)", name, err)
				}
			}
			for _, name := range kept {
				if _, err := os.Lstat(filepath.Join(dir, name)); err != nil {
					t.Errorf("%s was removed by Load: %v", name, err)
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
