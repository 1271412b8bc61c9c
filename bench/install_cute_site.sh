# Device side of the cutlass-dsl carry (bench/README.md): source from the repo root in each call; the first call
# stashes .carry/cs_a/site.part0, the second .carry/cs_b/site.part1 + site.sha256 and unpacks both into /tmp/site.
# source from the repo root on the device: stash carried parts; once both are there, unpack into /tmp/site
STASH=/root/stash; SITE=/tmp/site
mkdir -p $STASH
for d in .carry/cs_a .carry/cs_b; do [ -d $d ] && cp -f $d/site.part* $d/site.sha256 $STASH/ 2>/dev/null; done
# or one call: .carry/cs1/site.tar.xz (the whole site but the IKET profiler, xz with a 256 MiB dictionary: 55 MiB)
if [ ! -f $SITE/.ok ] && [ -f .carry/cs1/site.tar.xz ]; then
  (cd .carry/cs1 && sha256sum -c --quiet site.tar.xz.sha256 && mkdir -p $SITE && xz -dc site.tar.xz | tar xf - -C $SITE && touch $SITE/.ok) || echo "install FAILED"
fi
if [ ! -f $SITE/.ok ]; then
  if [ -f $STASH/site.part0 ] && [ -f $STASH/site.part1 ]; then
    (cd $STASH && cat site.part0 site.part1 > site312.tar.xz && sha256sum -c --quiet site.sha256 && mkdir -p $SITE && xz -dc site312.tar.xz | tar xf - -C $SITE && touch $SITE/.ok) || echo "install FAILED"
  else
    echo "stashed; parts so far: $(ls $STASH)"
  fi
fi
export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
