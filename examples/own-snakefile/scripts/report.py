# A `script:` rule's script: Snakemake defines `snakemake` (its job) here.
snakemake = globals()["snakemake"]
with open(snakemake.output[0], "w") as f:
    f.write("\n".join(snakemake.input) + "\n")
