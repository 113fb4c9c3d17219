"""The embedded point-cloud dataset: surfaces of open3d's primitive meshes, each sample stretched,
turned, unevenly sampled and noisy, written as binary PLY point clouds.

Per sample: an anisotropic scale (0.6-1.4 per axis) of the mesh, points sampled uniformly on its
surface and then thinned with a density that rises exponentially along a random direction (one side
of the shape densely covered, the other sparsely, as a scanner sees it), a random turn about the up
(z) axis with a tilt of up to 20 degrees, and Gaussian noise of 0.5-2% of the size. Shape
parameters (a cylinder's height, a torus's tube) vary too, so no two samples are alike."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ...errors import EffvisionError
from ..generated import write_once
from .io import open3d_module
from .transforms import rotation_about

CLASSES = ["arrow", "box", "cone", "cylinder", "octahedron", "sphere", "tetrahedron", "torus"]
VERSION = 1


def _mesh(name: str, rng: np.random.Generator):
    make = open3d_module().geometry.TriangleMesh
    if name == "arrow":
        return make.create_arrow(
            cylinder_radius=rng.uniform(0.1, 0.2),
            cone_radius=rng.uniform(0.25, 0.4),
            cylinder_height=rng.uniform(0.8, 1.2),
            cone_height=rng.uniform(0.4, 0.7),
        )
    if name == "box":
        return make.create_box(*rng.uniform(0.6, 1.4, 3))
    if name == "cone":
        return make.create_cone(radius=rng.uniform(0.4, 0.7), height=rng.uniform(0.8, 1.6), resolution=40)
    if name == "cylinder":
        return make.create_cylinder(radius=rng.uniform(0.3, 0.6), height=rng.uniform(0.8, 1.8), resolution=40)
    if name == "octahedron":
        return make.create_octahedron(1.0)
    if name == "sphere":
        return make.create_sphere(1.0, resolution=24)
    if name == "tetrahedron":
        return make.create_tetrahedron(1.0)
    return make.create_torus(
        torus_radius=1.0, tube_radius=rng.uniform(0.2, 0.45), radial_resolution=40, tubular_resolution=24
    )


def _rotation(rng: np.random.Generator) -> np.ndarray:
    """A turn about the up (z) axis, tilted up to 20 degrees about x and y."""
    tilt = math.radians(20)
    turns = (
        rotation_about(2, rng.uniform(0, 2 * math.pi)),
        rotation_about(0, rng.uniform(-tilt, tilt)),
        rotation_about(1, rng.uniform(-tilt, tilt)),
    )
    return turns[0] @ turns[1] @ turns[2]


def render_shape(label: int, rng: np.random.Generator, points: int = 2048) -> np.ndarray:
    """(points, 3) float32 of one sample of class `label`."""
    o3d = open3d_module()
    mesh = _mesh(CLASSES[label], rng)
    verts = np.asarray(mesh.vertices)
    verts = (verts - verts.mean(axis=0)) * rng.uniform(0.6, 1.4, 3)
    mesh.vertices = o3d.utility.Vector3dVector(verts)
    o3d.utility.random.seed(int(rng.integers(2**31)))
    dense = np.asarray(mesh.sample_points_uniformly(number_of_points=3 * points).points)
    direction = rng.normal(size=3)
    direction /= np.linalg.norm(direction)
    reach = np.abs(dense @ direction).max() or 1.0
    weight = np.exp(rng.uniform(0.0, 2.5) * (dense @ direction) / reach)
    keep = rng.choice(len(dense), points, replace=False, p=weight / weight.sum())
    cloud = dense[keep] @ _rotation(rng).T
    size = np.linalg.norm(cloud.max(axis=0) - cloud.min(axis=0))
    cloud += rng.normal(0.0, rng.uniform(0.005, 0.02) * size, cloud.shape)
    return cloud.astype(np.float32)


def write_ply(path: Path, cloud: np.ndarray) -> None:
    o3d = open3d_module()
    pcd = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(cloud.astype(np.float64)))
    if not o3d.io.write_point_cloud(str(path), pcd, write_ascii=False):
        raise EffvisionError(f"could not write {path}")


def generate(
    root: Path, train_per_class: int = 100, val_per_class: int = 40, points: int = 2048, seed: int = 0, progress=None
) -> Path:
    """Write <root>/{train,val}/<class>/<n>.ply once; reuse it when the parameters match."""
    params = {
        "version": VERSION,
        "train_per_class": train_per_class,
        "val_per_class": val_per_class,
        "points": points,
        "seed": seed,
    }
    return write_once(
        root,
        params,
        CLASSES,
        {"train": train_per_class, "val": val_per_class},
        lambda folder, label, n, rng: write_ply(folder / f"{n:04d}.ply", render_shape(label, rng, points)),
        "generating synthetic-shapes clouds",
        progress,
    )
