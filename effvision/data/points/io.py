"""Point-cloud and mesh files to (N, 3+) float32 arrays: xyz first, then any colour or intensity.

open3d reads PLY, PCD (ascii, binary, binary_compressed), OBJ and STL, and samples points from
mesh surfaces. Small readers cover what it cannot: OFF with ModelNet's header defect
(`OFF3514 3546 0` on one line), raw LiDAR `.bin` records (float32 x 4, 5 or 6), XYZ/TXT and NPY.
Every failure is a PointCloudError naming the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...errors import EffvisionError

MESH_EXTS = {".off", ".obj", ".stl"}
POINT_EXTS = MESH_EXTS | {".ply", ".pcd", ".xyz", ".xyzn", ".xyzrgb", ".pts", ".txt", ".npy", ".bin"}


class PointCloudError(EffvisionError):
    """A point-cloud or mesh file that cannot be read (the message names the file)."""


def is_point_file(name: str) -> bool:
    return Path(name).suffix.lower() in POINT_EXTS


def open3d_module():
    try:
        import open3d as o3d
    except (ImportError, OSError) as exc:  # OSError: libusb-1.0 missing
        raise PointCloudError(
            f"open3d is not usable ({str(exc).splitlines()[0]}): run 'make install' (as root it installs the "
            "system library libusb-1.0-0), or 'apt-get install libusb-1.0-0' and 'pip install open3d-cpu'"
        ) from None
    o3d.utility.set_verbosity_level(o3d.utility.VerbosityLevel.Error)
    return o3d


def _sample_mesh(path: Path, vertices: np.ndarray, triangles: np.ndarray, n: int, seed: int) -> np.ndarray:
    """n points uniformly on the surface (area-weighted); a mesh without faces gives its vertices."""
    if len(triangles) == 0:
        return vertices.astype(np.float32)
    o3d = open3d_module()
    mesh = o3d.geometry.TriangleMesh(
        o3d.utility.Vector3dVector(vertices.astype(np.float64)), o3d.utility.Vector3iVector(triangles.astype(np.int32))
    )
    o3d.utility.random.seed(seed)
    points = np.asarray(mesh.sample_points_uniformly(number_of_points=n).points, dtype=np.float32)
    if not len(points):
        raise PointCloudError(f"{path}: the mesh has no surface to sample")
    return points


def read_off(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(vertices, triangles) of an OFF file; polygons are fanned into triangles. Accepts the
    header joined to the counts (`OFF3514 3546 0`), as many ModelNet files have it."""
    tokens = path.read_text(errors="replace").split("\n")
    lines = [ln.split("#")[0].strip() for ln in tokens]
    lines = [ln for ln in lines if ln]
    if not lines or not lines[0].upper().startswith("OFF"):
        raise PointCloudError(
            f"{path}: not an OFF file (first line {lines[0][:30]!r})" if lines else f"{path}: empty file"
        )
    head = lines[0][3:].split()
    body = lines[1:]
    if not head:
        head, body = (body[0].split() if body else []), body[1:]
    try:
        nv, nf = int(head[0]), int(head[1])
        verts = np.array([body[i].split()[:3] for i in range(nv)], dtype=np.float64)
    except (IndexError, ValueError):
        raise PointCloudError(
            f"{path}: OFF header or vertex lines do not match (header says {' '.join(head[:3])}, "
            f"{len(body)} lines follow)"
        ) from None
    tris = []
    for n, line in enumerate(body[nv : nv + nf]):
        try:
            idx = [int(v) for v in line.split()]
        except ValueError:
            raise PointCloudError(f"{path}: face {n} is not a row of integers ({line[:40]!r})") from None
        k = idx[0] if idx else 0
        poly = idx[1 : 1 + k]
        if k < 3 or len(poly) < k:
            raise PointCloudError(f"{path}: face {n} lists {len(poly)} of its {k} vertex indices (truncated file?)")
        tris += [(poly[0], poly[j], poly[j + 1]) for j in range(1, k - 1)]
    faces = np.array(tris, dtype=np.int64).reshape(-1, 3)
    if len(body) < nv + nf or (len(faces) and (faces.max() >= nv or faces.min() < 0)):
        raise PointCloudError(
            f"{path}: OFF file is truncated or its faces index missing vertices ({nv} vertices, {nf} faces declared)"
        )
    return verts, faces


def read_bin(path: Path, width: int) -> np.ndarray:
    """Raw float32 records of `width` values (KITTI 4, nuScenes 5, ScanNet/SUN RGB-D 6)."""
    size = path.stat().st_size
    if size == 0 or size % (4 * width):
        raise PointCloudError(
            f"{path}: {size} bytes is not a whole number of {width}-float32 records (set bin_width: 4, 5 or 6)"
        )
    return np.fromfile(path, dtype=np.float32).reshape(-1, width)


_PLY_BYTES = {
    "char": 1,
    "uchar": 1,
    "int8": 1,
    "uint8": 1,
    "short": 2,
    "ushort": 2,
    "int16": 2,
    "uint16": 2,
    "int": 4,
    "uint": 4,
    "int32": 4,
    "uint32": 4,
    "float": 4,
    "float32": 4,
    "double": 8,
    "float64": 8,
}


PCD_HEADER_LINES, PCD_HEADER_LINE_BYTES = 64, 4096  # a PCD header is about 11 short lines


def _check_complete(path: Path) -> None:
    """open3d keeps what it read before a PLY or PCD ended early (and fills the rest with
    garbage); compare the data with what the header declares."""
    ext = path.suffix.lower()
    if ext == ".pcd":
        _check_pcd(path)
    elif ext == ".ply":
        _check_ply(path)


def _check_pcd(path: Path) -> None:
    """ASCII and binary PCD: as many rows (bytes) as POINTS x the field sizes. binary_compressed
    carries its own sizes, which open3d checks. Only the header and (for ASCII) the rows are read;
    a binary body is measured by the file's size, not read a second time before open3d reads it."""
    header = {}
    with open(path, "rb") as f:
        for _ in range(PCD_HEADER_LINES):
            line = f.readline(PCD_HEADER_LINE_BYTES)
            if not line:
                break
            words = line.decode("ascii", "replace").split()
            if words and not words[0].startswith("#"):
                header[words[0].upper()] = words[1:]
                if words[0].upper() == "DATA":
                    break
        try:
            points = int(header["POINTS"][0])
            sizes = [int(v) for v in header.get("SIZE", [])]
            counts = [int(v) for v in header.get("COUNT", ["1"] * len(sizes))]
            kind = header["DATA"][0].lower()
        except (KeyError, IndexError, ValueError):
            raise PointCloudError(f"{path}: not a PCD file (its header lacks POINTS, SIZE or DATA)") from None
        if kind == "ascii":
            have = sum(1 for line in f if line.strip())
            if have < points:
                raise PointCloudError(
                    f"{path}: truncated (the header declares {points} points, the file has {have} rows)"
                )
        elif kind == "binary":
            have, need = path.stat().st_size - f.tell(), points * sum(s * c for s, c in zip(sizes, counts, strict=True))
            if have < need:
                raise PointCloudError(f"{path}: truncated ({have} bytes of data, the header needs {need})")


def _check_ply(path: Path) -> None:
    """PLY lines for ASCII, bytes for binary (faces counted as triangles)."""
    data = path.read_bytes()
    end = data.find(b"end_header")
    if not data.startswith(b"ply") or end < 0:
        raise PointCloudError(f"{path}: not a PLY file (no ply header)")
    header = data[:end].decode("ascii", "replace").splitlines()
    body = data[data.index(b"\n", end) + 1 :]
    ascii_format = any(line.startswith("format ascii") for line in header)
    elements, rows, least = [], 0, 0
    for line in header:
        words = line.split()
        if words[:1] == ["element"] and len(words) == 3 and words[2].isdigit():
            elements.append([words[1], int(words[2]), 0])
        elif words[:1] == ["property"] and elements:
            if words[1] == "list" and len(words) >= 4:  # count + three indices at least
                elements[-1][2] += _PLY_BYTES.get(words[2], 1) + 3 * _PLY_BYTES.get(words[3], 4)
            else:
                elements[-1][2] += _PLY_BYTES.get(words[1], 4)
    for _, count, size in elements:
        rows += count
        least += count * size
    if ascii_format:
        have = sum(1 for line in body.splitlines() if line.strip())
        if have < rows:
            raise PointCloudError(f"{path}: truncated (the header declares {rows} rows, the file has {have})")
    elif len(body) < least:
        raise PointCloudError(f"{path}: truncated ({len(body)} bytes of data, the header needs at least {least})")


def _open3d_file(path: Path, mesh_points: int, seed: int) -> np.ndarray:
    o3d = open3d_module()
    _check_complete(path)
    if path.suffix.lower() in (".obj", ".stl", ".ply"):
        mesh = o3d.io.read_triangle_mesh(str(path))
        if len(mesh.triangles):
            return _sample_mesh(path, np.asarray(mesh.vertices), np.asarray(mesh.triangles), mesh_points, seed)
        if path.suffix.lower() != ".ply":
            raise PointCloudError(f"{path}: no triangles could be read (corrupt or not a mesh)")
    cloud = o3d.io.read_point_cloud(str(path))
    points = np.asarray(cloud.points, dtype=np.float32)
    if not len(points):
        raise PointCloudError(
            f"{path}: no points could be read (empty, truncated or not a {path.suffix[1:].upper()} file)"
        )
    if cloud.has_colors():
        points = np.concatenate([points, np.asarray(cloud.colors, dtype=np.float32)], axis=1)
    return points


def read_points(path: str | Path, mesh_points: int = 2048, bin_width: int = 4, seed: int = 0) -> np.ndarray:
    """(N, 3+) float32 of a point-cloud file, or `mesh_points` points sampled on a mesh's surface.
    Non-finite points (organized PCD clouds mark holes with NaN) are dropped."""
    path = Path(path)
    if not path.is_file():
        raise PointCloudError(f"point cloud not found: {path}")
    ext = path.suffix.lower()
    if ext not in POINT_EXTS:
        raise PointCloudError(f"{path}: unknown point-cloud format {ext!r} (known: {', '.join(sorted(POINT_EXTS))})")
    if path.stat().st_size == 0:
        raise PointCloudError(f"{path}: empty file")
    try:
        if ext == ".off":
            points = _sample_mesh(path, *read_off(path), mesh_points, seed)
        elif ext == ".bin":
            points = read_bin(path, bin_width)
        elif ext == ".npy":
            points = np.load(path, allow_pickle=False).astype(np.float32)
        elif ext in (".xyz", ".xyzn", ".xyzrgb", ".pts", ".txt"):
            text = path.read_text(errors="replace").replace(",", " ")
            points = np.loadtxt(text.splitlines(), dtype=np.float32, ndmin=2)
        else:
            points = _open3d_file(path, mesh_points, seed)
    except PointCloudError:
        raise
    except Exception as exc:  # noqa: BLE001  (numpy, open3d and parsers raise many types on bad files)
        raise PointCloudError(
            f"{path}: cannot read it ({(str(exc).splitlines() or [type(exc).__name__])[0][:160]})"
        ) from None
    if points.ndim != 2 or points.shape[1] < 3:
        raise PointCloudError(f"{path}: expected rows of at least 3 values (x y z ...), got shape {points.shape}")
    points = points[np.isfinite(points[:, :3]).all(axis=1)]
    if not len(points):
        raise PointCloudError(f"{path}: no finite points")
    return np.ascontiguousarray(points, dtype=np.float32)


def guess_bin_width(path: Path) -> int:
    """A convention, not a measurement: nuScenes `.pcd.bin` files are 5 wide, others KITTI's 4
    when it divides the file, else 5 or 6. ScanNet/SUN RGB-D files (6 wide) often divide by 4
    too: say the width (`--bin-width`, a card's `bin_width`) for them."""
    size = path.stat().st_size
    if path.name.endswith(".pcd.bin") and size % 20 == 0:
        return 5
    return next((w for w in (4, 5, 6) if size and size % (4 * w) == 0), 4)


def describe(path: str | Path, bin_width: int | None = None) -> dict:
    """What `data inspect` says of a point-cloud or mesh file: points (or a mesh's vertices and
    faces) and channels; raises PointCloudError. Each file is parsed once."""
    path = Path(path)
    ext = path.suffix.lower()
    if path.is_file() and path.stat().st_size and ext in (".off", ".obj", ".stl", ".ply"):
        if ext == ".off":
            verts, faces = read_off(path)
        else:
            _check_complete(path)
            mesh = open3d_module().io.read_triangle_mesh(str(path))
            verts, faces = np.asarray(mesh.vertices), np.asarray(mesh.triangles)
        if len(faces):
            return {"points": len(verts), "channels": 3, "mesh": True, "faces": len(faces)}
    width = bin_width or (guess_bin_width(path) if ext == ".bin" and path.is_file() else 4)
    points = read_points(path, mesh_points=1, bin_width=width)
    return {"points": len(points), "channels": int(points.shape[1]), **({"bin_width": width} if ext == ".bin" else {})}
