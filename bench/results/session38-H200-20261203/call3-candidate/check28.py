import sys, torch, cufold
g = torch.Generator(device="cuda").manual_seed(0)
n = 1 << 28
x = torch.randint(-8, 8, (n,), device="cuda", generator=g).to(torch.float32)
ref = torch.cumsum(x.double(), 0)
print("ref max |.|", ref.abs().max().item())
t = torch.cumsum(x, 0)
c = torch.as_tensor(cufold.cumsum(x), device="cuda")
for name, y in (("torch", t), ("cufold", c)):
    d = (y.double() - ref).abs()
    bad = torch.nonzero(d > 0)
    print(name, "max diff", d.max().item(), "mismatches", bad.numel(), "first", bad[:3].flatten().tolist())
xi = torch.randint(-8, 8, (n,), device="cuda", generator=g, dtype=torch.int32)
ci = torch.as_tensor(cufold.cumsum(xi, dtype="int32"), device="cuda")
print("int32 equal torch:", torch.equal(ci, torch.cumsum(xi, 0, dtype=torch.int32)))
